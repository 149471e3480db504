/// @file graphrun/graphrun.h
/// Umbrella header: everything a graphrun user needs (except <graphrun/eigen.h>,
/// which is for kernel authors).
#pragma once

#include <graphrun/attr_value.h>
#include <graphrun/graph.h>
#include <graphrun/op_kernel.h>
#include <graphrun/ops.h>
#include <graphrun/session.h>
#include <graphrun/status.h>
#include <graphrun/tensor.h>

/// @mainpage graphrun API reference
///
/// graphrun runs dataflow graphs the way a TensorFlow-1 `Session` does, as a
/// C++20 library on oneTBB's flow graph with Eigen kernels. This reference
/// is made from the public headers:
///
/// | header | holds | link |
/// |---|---|---|
/// | graphrun.h | all of the headers below up to eigen.h | `graphrun::graphrun` |
/// | status.h | graphrun::Status, graphrun::Result, the status factories | |
/// | tensor.h | graphrun::DType, graphrun::Shape, graphrun::Tensor | |
/// | graph.h | graphrun::Graph, graphrun::Node, graphrun::Output | |
/// | ops.h | the builders of graphrun::ops | |
/// | session.h | Session, SessionOptions, RunOptions, Callable, PartialRunHandle, ThreadPool | |
/// | op_kernel.h | graphrun::OpDef, graphrun::OpKernel, graphrun::OpKernelContext,
/// graphrun::OpRegistry: custom ops | | | eigen.h | Eigen views of tensors, for kernel authors |
/// `graphrun::graphrun` | | graph_def.h | GraphDef import and export, graph files |
/// `graphrun::graphdef` | | remote_session.h | graphrun::RemoteSession | `graphrun::service` | |
/// server.h | graphrun::Server | `graphrun::service` | | session_registry.h |
/// graphrun::SessionRegistry, graphrun::ServiceLimits | `graphrun::service_core` | |
/// session_service.h | graphrun::SessionServiceImpl, the gRPC service | `graphrun::service` |
///
/// Every class states its thread safety ("Thread safety: ..."): thread-safe,
/// thread-compatible (a value: distinct objects may be used from different
/// threads, one object from one thread at a time) or not thread-safe, with
/// its lifetime rule. No exception crosses the API: fallible calls return a
/// Status or a Result whose message names the culprit.
///
/// The topic pages in the repository's docs/ directory (core.md,
/// partial-runs.md, concurrency.md, kernels.md, graph-files.md, service.md,
/// cli.md) explain the behaviour behind these declarations.

/// @namespace graphrun
/// Everything graphrun offers.

/// @namespace graphrun::ops
/// Op builder functions: each adds a node to a Graph (<graphrun/ops.h>).
