# Weights: the LM head (safetensors loading, zero-copy mmap; the seeded demo
# head), the safetensors writer, and the flashsampler-demo-head tool.
# Included from server/CMakeLists.txt.

add_library(flashsampler_weights
  ${CMAKE_CURRENT_LIST_DIR}/lm_head.cc
  ${CMAKE_CURRENT_LIST_DIR}/safetensors_file.cc
  ${CMAKE_CURRENT_LIST_DIR}/safetensors_writer.cc)
target_include_directories(flashsampler_weights PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(flashsampler_weights
  PUBLIC absl::status absl::statusor absl::strings flashsampler_kernels_common
  PRIVATE nlohmann_json::nlohmann_json Threads::Threads)

add_executable(flashsampler-demo-head ${CMAKE_CURRENT_LIST_DIR}/demo_head_main.cc)
target_link_libraries(flashsampler-demo-head PRIVATE
  flashsampler_weights absl::flags absl::flags_parse absl::flags_usage absl::strings)
