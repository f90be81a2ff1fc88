# IncludeRules.cmake: the include rules of server/ and kernels/ (which folder
# may include what) and their check, the ctest `include_rules_test`:
#
#   cmake -DSOURCE_DIR=<repository> -DSCRATCH_DIR=<empty folder> -P cmake/IncludeRules.cmake
#
# Every #include line of every .h/.cc/.cu/.cuh under server/ and kernels/ is
# sorted into a component (classify_include below: "server/engine",
# "kernels/common", "grpc", "proto", "absl", ... or "system" for any other
# <...> header) and must be one its folder's rule allows: a component, or an
# exact include path (e.g. grpcpp/support/status.h). A
# folder without a rule fails too, so a new folder needs a line here. System
# headers (<vector>, <sys/mman.h>, ...) are always allowed; a quoted include
# that no component claims fails (add its library to classify_include).
# Preprocessor conditions are ignored: an include under #if counts.
#
# Before it reads the repository, the check runs on a planted tree in
# SCRATCH_DIR (self_test below) and fails unless it finds exactly the planted
# violations: the check itself cannot silently stop failing.
#
# This is the one table of these rules; server/README-dev.md ("Layout")
# explains them. Change both together.
cmake_minimum_required(VERSION 3.25)

# ---- The rules ----------------------------------------------------------------
# include_rule(FOLDER ALLOWED...): files directly in FOLDER may include ALLOWED.
set(rule_folders "")
macro(include_rule folder)
  set("rule_${folder}" ${ARGN})
  list(APPEND rule_folders ${folder})
endmacro()

# server/ top: main.cc and the flags (server_config) wire every concern together.
include_rule(server
  server server/api server/batching server/engine server/model server/regions
  server/security server/telemetry server/local kernels/common absl grpc protobuf proto)
# The model: weights and their files. Nothing of engines, requests or gRPC.
include_rule(server/model     server/model kernels/common absl json random123)
# The engines: the model and the kernels. Never gRPC, protobuf, the wire
# format, regions, batching, the API, security or telemetry.
include_rule(server/engine
  server/engine server/model kernels/common kernels/cpu kernels/cuda absl cuda nccl)
# Memory regions of other processes: on their own (the parser resolves them).
include_rule(server/regions   server/regions absl cuda)
# Metrics: the engine's types (model shape, device memory) and gRPC's status
# codes for the `code` label, nothing else of gRPC.
include_rule(server/telemetry
  server/telemetry server/engine absl prometheus grpcpp/support/status.h)
# Batching: the engine and the metrics. Never gRPC, protobuf or the wire format.
include_rule(server/batching  server/batching server/engine server/telemetry kernels/common absl)
# The gRPC API: batching, engines, regions, metrics, gRPC and protobuf; not
# security, which wraps it.
include_rule(server/api
  server/api server/batching server/engine server/regions server/telemetry kernels/common
  absl grpc protobuf proto)
# Security: gRPC, OpenSSL, the API's status mapping, the clients' file reader.
include_rule(server/security
  server/security server/api client/credential_files.h absl grpc proto openssl)
# The local channel: the API's service (and through it gRPC's status type and
# the generated messages), the frames it shares with the clients, and the
# batcher's spin-wait (it trades a core for a wake-up as the worker does).
include_rule(server/local
  server/local server/api server/telemetry absl grpc proto client/local_frame.h
  server/batching/spin_wait.h)
# kernels/: framework-free compute, never gRPC, protobuf, absl or server/.
include_rule(kernels/common   kernels/common random123)
include_rule(kernels/cpu      kernels/common kernels/cpu random123)
# CUTLASS / CuTe (header-only, the pinned nvidia-cutlass package): the Hopper
# stage 1's mainloop (kernels/cuda/fused_sample_sm90.cu), kernels/cuda only.
include_rule(kernels/cuda     kernels/common kernels/cuda cuda nccl cutlass)
# The kernel benchmarks are tools: flags and JSON too, still no server/ or gRPC.
include_rule(kernels/bench
  kernels/common kernels/cpu kernels/cuda kernels/bench absl cuda nccl blas json)

# ---- The check ----------------------------------------------------------------
# classify_include(PATH BRACKET OUT): the component an include path belongs to.
function(classify_include path bracket out)
  if(path MATCHES "^server/([^/]+)/")
    set(c "server/${CMAKE_MATCH_1}")
  elseif(path MATCHES "^server/[^/]+$")
    set(c "server")
  elseif(path MATCHES "^kernels/([^/]+)/")
    set(c "kernels/${CMAKE_MATCH_1}")
  elseif(path MATCHES "^(client|fuzz|loadtest|tests)/")
    set(c "${CMAKE_MATCH_1}")
  elseif(path MATCHES "^(flashsampler/v1|grpc/health/v1)/")  # generated from proto/
    set(c "proto")
  elseif(path MATCHES "^(grpcpp|grpc|grpc\\+\\+)/")
    set(c "grpc")
  elseif(path MATCHES "^google/protobuf/")
    set(c "protobuf")
  elseif(path MATCHES "^absl/")
    set(c "absl")
  elseif(path MATCHES "^prometheus/")
    set(c "prometheus")
  elseif(path MATCHES "^openssl/")
    set(c "openssl")
  elseif(path MATCHES "^nlohmann/")
    set(c "json")
  elseif(path MATCHES "^Random123/")
    set(c "random123")
  elseif(path MATCHES "^(cutlass|cute)/")
    set(c "cutlass")
  elseif(path MATCHES "^nccl\\.h$")
    set(c "nccl")
  elseif(path MATCHES "^(cuda[A-Za-z0-9_]*\\.h|cublas[A-Za-z0-9_]*\\.h|cooperative_groups|cub/|thrust/|cuda/|nvtx3/)")
    set(c "cuda")
  elseif(path MATCHES "^(cblas\\.h|openblas)")
    set(c "blas")
  elseif(path MATCHES "^(gtest|gmock)/")
    set(c "gtest")
  elseif(bracket STREQUAL "<")
    set(c "system")
  else()
    set(c "unclassified")
  endif()
  set(${out} "${c}" PARENT_SCOPE)
endfunction()

# check_includes(ROOT OUT): OUT = one message per violation under ROOT.
function(check_includes root out)
  set(found "")
  set(unruled "")
  file(GLOB_RECURSE files LIST_DIRECTORIES false RELATIVE "${root}"
       "${root}/server/*.h" "${root}/server/*.cc" "${root}/server/*.cu" "${root}/server/*.cuh"
       "${root}/kernels/*.h" "${root}/kernels/*.cc" "${root}/kernels/*.cu" "${root}/kernels/*.cuh")
  list(SORT files)
  foreach(file IN LISTS files)
    get_filename_component(folder "${file}" DIRECTORY)
    if(NOT folder IN_LIST rule_folders)
      if(NOT folder IN_LIST unruled)
        list(APPEND unruled "${folder}")
        list(APPEND found "${folder}/: no include rule (add include_rule(${folder} ...) to cmake/IncludeRules.cmake)")
      endif()
      continue()
    endif()
    file(STRINGS "${root}/${file}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]")
    foreach(line IN LISTS lines)
      if(NOT line MATCHES "#[ \t]*include[ \t]*([<\"])([^>\"]+)[>\"]")
        continue()
      endif()
      set(bracket "${CMAKE_MATCH_1}")
      set(path "${CMAKE_MATCH_2}")
      classify_include("${path}" "${bracket}" component)
      if(component STREQUAL "system" OR component IN_LIST "rule_${folder}" OR path IN_LIST "rule_${folder}")
        continue()
      endif()
      string(REPLACE ";" " " allowed "${rule_${folder}}")
      list(APPEND found "${file}: includes ${path} (${component}), but ${folder}/ may include only: ${allowed}")
    endforeach()
  endforeach()
  set(${out} "${found}" PARENT_SCOPE)
endfunction()

# self_test(SCRATCH): the check finds exactly the planted violations.
function(self_test scratch)
  file(REMOVE_RECURSE "${scratch}")
  file(WRITE "${scratch}/server/engine/planted.h"
    "#include <vector>\n"
    "#include \"server/model/lm_head.h\"\n"
    "#include \"kernels/cpu/tiled_sampler.h\"\n"
    "#include <grpcpp/grpcpp.h>\n"                   # violation: gRPC in the engine
    "#include \"flashsampler/v1/sampler.pb.h\"\n"    # violation: the wire format
    "  #  include \"server/api/request_parser.h\"\n") # violation: the API layer
  file(WRITE "${scratch}/server/telemetry/planted.cc"
    "#include <grpcpp/support/status.h>\n"
    "#include <grpcpp/grpcpp.h>\n")                  # violation: more than the status codes
  file(WRITE "${scratch}/kernels/common/planted.h"
    "#include <Random123/philox.h>\n"
    "#include \"absl/status/status.h\"\n"            # violation: absl in kernels/
    "#include <cute/tensor.hpp>\n")                  # violation: CUTLASS outside kernels/cuda
  file(WRITE "${scratch}/server/model/planted.cc"
    "#include \"some_library/unknown.h\"\n")         # violation: unclassified
  file(WRITE "${scratch}/server/newfolder/planted.h"
    "#include <vector>\n")                           # violation: a folder without a rule
  check_includes("${scratch}" found)
  list(LENGTH found n)
  set(expected
    "server/engine/planted.h: includes grpcpp/grpcpp.h"
    "server/engine/planted.h: includes flashsampler/v1/sampler.pb.h"
    "server/engine/planted.h: includes server/api/request_parser.h"
    "server/telemetry/planted.cc: includes grpcpp/grpcpp.h"
    "kernels/common/planted.h: includes absl/status/status.h"
    "kernels/common/planted.h: includes cute/tensor.hpp"
    "server/model/planted.cc: includes some_library/unknown.h (unclassified)"
    "server/newfolder/: no include rule")
  list(LENGTH expected n_expected)
  set(missing "")
  foreach(want IN LISTS expected)
    string(FIND "${found}" "${want}" at)
    if(at EQUAL -1)
      list(APPEND missing "${want}")
    endif()
  endforeach()
  if(NOT n EQUAL n_expected OR missing)
    string(REPLACE ";" "\n  " found_text "${found}")
    string(REPLACE ";" "\n  " missing_text "${missing}")
    message(FATAL_ERROR "include rules self-test: expected ${n_expected} planted violations, "
                        "found ${n}:\n  ${found_text}\nnot found:\n  ${missing_text}")
  endif()
  file(REMOVE_RECURSE "${scratch}")
endfunction()

if(NOT SOURCE_DIR OR NOT SCRATCH_DIR)
  message(FATAL_ERROR "usage: cmake -DSOURCE_DIR=<repository> -DSCRATCH_DIR=<folder> -P IncludeRules.cmake")
endif()
self_test("${SCRATCH_DIR}")
check_includes("${SOURCE_DIR}" violations)
if(violations)
  list(LENGTH violations n)
  string(REPLACE ";" "\n  " text "${violations}")
  message(FATAL_ERROR "${n} include(s) break the rules of cmake/IncludeRules.cmake "
                      "(server/README-dev.md, \"Layout\"):\n  ${text}")
endif()
message(STATUS "include rules: every include of server/ and kernels/ is allowed")
