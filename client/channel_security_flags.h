// The client-side security flags shared by flashsampler-cli and
// flashsampler-load: --tls_ca, --tls_cert, --tls_key, --tls_server_name,
// --auth_token_file (Abseil flags, defined in channel_security_flags.cc).
//
// Read them after absl::ParseCommandLine, from one thread.
#pragma once

#include "client/channel_security.h"

namespace flashsampler {

ChannelSecurityOptions ChannelSecurityOptionsFromFlags();

}  // namespace flashsampler
