// The part of cudnn-frontend minidl uses: its descriptor builders (tensors, operations, operation
// graphs, heuristics, engine configs, execution plans, variant packs), which wrap cuDNN's backend
// API one descriptor at a time. cudnn_frontend.h also brings the v1 graph API (every node type,
// serialization through nlohmann/json, kernel caches), which minidl does not use and which took
// most of each including file's compile time: a translation unit including only this header
// compiles about seven times faster.
#pragma once
#include <cudnn.h>

#include <cudnn_frontend_ConvDesc.h>
#include <cudnn_frontend_Engine.h>
#include <cudnn_frontend_EngineConfig.h>
#include <cudnn_frontend_ExecutionPlan.h>
#include <cudnn_frontend_Heuristics.h>
#include <cudnn_frontend_Operation.h>
#include <cudnn_frontend_OperationGraph.h>
#include <cudnn_frontend_PointWiseDesc.h>
#include <cudnn_frontend_Tensor.h>
#include <cudnn_frontend_VariantPack.h>

// The short names cudnn_frontend.h gives these builders (redeclaring them is allowed).
namespace cudnn_frontend {
using ConvDesc = ConvDesc_v8;
using ConvDescBuilder = ConvDescBuilder_v8;
using EngineHeuristics = EngineHeuristics_v8;
using EngineHeuristicsBuilder = EngineHeuristicsBuilder_v8;
}  // namespace cudnn_frontend
