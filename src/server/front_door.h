// The service the transport runs: each request's header is screened (Host
// against DNS rebinding, Origin, API key) before its body is read, then
// its route answers; allowed pages may read the answer (CORS).
#pragma once

#include <memory>

#include "server/http_transport.h"
#include "server/server_context.h"

namespace m40::server {

std::unique_ptr<HttpService> make_front_door(ServerContext& s);

}  // namespace m40::server
