# Sanitizer and fuzzing builds (scripts/sanitizers.sh, scripts/fuzz.sh drive them).
#
# FLASHSAMPLER_SANITIZE: compile and link every target with the given
#   sanitizers. "" (default): none. "address,undefined": ASan + UBSan (any UBSan
#   finding aborts: -fno-sanitize-recover). "thread": TSan. Use a separate build
#   folder per setting, with FLASHSAMPLER_CUDA=OFF (nvcc code is not
#   instrumented). The prebuilt Debian gRPC/protobuf/abseil/OpenBLAS libraries
#   are not instrumented. Under TSan, Abseil's Mutex/CondVar/Notification would
#   then look like no synchronization at all; the thread build therefore links
#   every target against cmake/tsan/absl_mutex_annotations.cc, which tells TSan
#   about their happens-before edges (see that file). scripts/tsan.supp lists
#   what is suppressed in third-party code, with reasons.
# FLASHSAMPLER_FUZZ: build the libFuzzer targets in fuzz/ (needs clang). Our own
#   code is compiled with -fsanitize=fuzzer-no-link,address,undefined (coverage
#   feedback plus ASan/UBSan); the fuzz binaries link -fsanitize=fuzzer.
set(FLASHSAMPLER_SANITIZE "" CACHE STRING
    "Sanitizers for every target: empty (none), address,undefined, or thread")
set_property(CACHE FLASHSAMPLER_SANITIZE PROPERTY STRINGS "" "address,undefined" "thread")
option(FLASHSAMPLER_FUZZ "Build the libFuzzer targets in fuzz/ (clang only; adds ASan+UBSan)" OFF)

set(_fs_sanitize "${FLASHSAMPLER_SANITIZE}")
if(FLASHSAMPLER_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR
      "FLASHSAMPLER_FUZZ=ON needs clang (libFuzzer), but the C++ compiler is "
      "${CMAKE_CXX_COMPILER_ID}. Configure a fresh build folder with "
      "-DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ (scripts/fuzz.sh does).")
  endif()
  if(_fs_sanitize AND NOT _fs_sanitize STREQUAL "address,undefined")
    message(FATAL_ERROR "FLASHSAMPLER_FUZZ=ON builds with address,undefined; "
                        "it cannot be combined with FLASHSAMPLER_SANITIZE=${_fs_sanitize}")
  endif()
  set(_fs_sanitize "address,undefined")
endif()

if(_fs_sanitize)
  if(NOT _fs_sanitize MATCHES "^(address,undefined|undefined,address|address|undefined|thread)$")
    message(FATAL_ERROR "FLASHSAMPLER_SANITIZE must be address,undefined or thread, "
                        "got '${_fs_sanitize}'")
  endif()
  set(_fs_flags -fsanitize=${_fs_sanitize} -fno-omit-frame-pointer -g)
  if(_fs_sanitize MATCHES "undefined")
    # Any UBSan finding is fatal, so a test cannot pass with undefined behaviour.
    list(APPEND _fs_flags -fno-sanitize-recover=undefined)
  endif()
  set(_fs_compile_flags ${_fs_flags})
  if(FLASHSAMPLER_FUZZ)
    list(APPEND _fs_compile_flags -fsanitize=fuzzer-no-link)
  endif()
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${_fs_compile_flags}>")
  add_link_options(${_fs_flags})
  if(_fs_sanitize STREQUAL "thread")
    # Linked first into every later target, so the dynamic linker binds all
    # callers of absl::Mutex & co. (ours, gRPC's, Abseil's own) to it.
    add_library(flashsampler_tsan_absl_annotations SHARED
      ${CMAKE_CURRENT_LIST_DIR}/tsan/absl_mutex_annotations.cc)
    target_link_libraries(flashsampler_tsan_absl_annotations PRIVATE
      absl::synchronization absl::time ${CMAKE_DL_LIBS})
    link_libraries(flashsampler_tsan_absl_annotations)
  endif()
  message(STATUS "FlashSampler: sanitizers=${_fs_sanitize} fuzz=${FLASHSAMPLER_FUZZ}")
endif()
