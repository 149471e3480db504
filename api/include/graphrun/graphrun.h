// File: graphrun/graphrun.h
// Umbrella header: everything a graphrun user needs (except <graphrun/eigen.h>,
// which is for kernel authors).
#pragma once

#include <graphrun/attr_value.h>
#include <graphrun/graph.h>
#include <graphrun/op_kernel.h>
#include <graphrun/ops.h>
#include <graphrun/session.h>
#include <graphrun/status.h>
#include <graphrun/tensor.h>
