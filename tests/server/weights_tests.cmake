# Tests of the weights library (server/weights.cmake). Included from
# tests/server/CMakeLists.txt; every test is CPU-only and runs in seconds.

flashsampler_add_test(lm_head_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/lm_head_test.cc
  LIBS flashsampler_weights flashsampler_test_support absl::strings)
flashsampler_add_test(safetensors_file_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/safetensors_file_test.cc
  LIBS flashsampler_weights flashsampler_test_support absl::strings)
flashsampler_add_test(safetensors_writer_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/safetensors_writer_test.cc
  LIBS flashsampler_weights flashsampler_test_support nlohmann_json::nlohmann_json)
