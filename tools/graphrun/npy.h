// File: tools/graphrun/npy.h
// NumPy .npy files (numpy.lib.format) <-> graphrun Tensors.
//
//   GRAPHRUN_ASSIGN_OR_RETURN(Tensor t, npy::read_file("x.npy"));
//   GRAPHRUN_RETURN_IF_ERROR(npy::write_file(t, "y.npy"));
//
// Reads format versions 1.0, 2.0 and 3.0; writes 1.0 (2.0 when the header
// does not fit in 1.0's 16-bit length). Dtypes: '<f4' '<f8' '<i4' '<i8'
// '|b1' (also '=' and '>' byte orders; big-endian data is byte-swapped) in
// C order. Anything else (Fortran order, float16, unsigned, complex,
// strings, objects) is an InvalidArgument naming the file and the
// descriptor, never a crash; truncated or malformed files likewise.
//
// Thread safety: stateless functions; thread-safe for distinct arguments.
#pragma once

#include <graphrun/status.h>
#include <graphrun/tensor.h>

#include <filesystem>
#include <string>
#include <string_view>

namespace graphrun::npy {

// The bytes of an .npy file. `source` names them in messages (a path).
Result<Tensor> parse(std::string_view bytes, std::string_view source = "npy data");
// Reads the header first, then exactly the data bytes it declares: a file
// whose size is not header + data is refused before the data is read or
// allocated. Messages start with the path. NotFound when the file does not
// exist, PermissionDenied when it cannot be opened, InvalidArgument when it
// is not a regular file (a directory, /dev/zero, a pipe) and for parse()'s
// errors.
Result<Tensor> read_file(const std::filesystem::path& path);

// `tensor` (initialized) as .npy bytes: version 1.0 (2.0 for huge headers),
// little-endian descriptors ('|b1' for bool), header padded with spaces to a
// multiple of 64 bytes and ending in '\n'.
std::string serialize(const Tensor& tensor);
// Writes serialize(tensor) to `path` (replacing it); Internal with the
// system's reason on failure.
Status write_file(const Tensor& tensor, const std::filesystem::path& path);

}  // namespace graphrun::npy
