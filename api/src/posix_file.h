// Small POSIX file helpers shared by the readers of untrusted files (graph
// files in graphdef/, .npy files in tools/graphrun/): what a stat mode that
// is not a regular file names, and a file descriptor closed on scope exit.
// Private to the repository (not installed).
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <string_view>

namespace graphrun::internal {

// What a stat mode that is not a regular file names, for messages.
inline std::string_view file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a pipe";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// Closes a file descriptor on scope exit.
// Thread safety: one owner.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;
  ~FdCloser() { ::close(fd_); }

 private:
  int fd_;
};

}  // namespace graphrun::internal
