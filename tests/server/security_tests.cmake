# Tests of server/ security pieces (TLS config, token check, health-only port).
flashsampler_add_test(bearer_token_auth_test SOURCES bearer_token_auth_test.cc
  LIBS flashsampler_security TIMEOUT 60)
flashsampler_add_test(authenticated_sampler_service_test SOURCES authenticated_sampler_service_test.cc
  LIBS flashsampler_security TIMEOUT 60)
flashsampler_add_test(health_only_server_test SOURCES health_only_server_test.cc
  LIBS flashsampler_security TIMEOUT 60)
flashsampler_add_test(security_config_test SOURCES security_config_test.cc
  LIBS flashsampler_security absl::strings TIMEOUT 60)
target_include_directories(security_config_test PRIVATE ${PROJECT_SOURCE_DIR})
target_compile_definitions(security_config_test PRIVATE
  FLASHSAMPLER_MAKE_TEST_CERTS="${PROJECT_SOURCE_DIR}/tests/e2e/make_test_certs.sh")
