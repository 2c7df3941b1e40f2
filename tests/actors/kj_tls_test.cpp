// The Cap'n Proto endpoint's TLS streams (actors/tls/kj_tls.hpp), over a socket pair on
// one event loop: bytes both ways, a Cap'n Proto call, and handshakes that must fail.
#include <string>

#include <capnp/rpc-twoparty.h>
#include <doctest/doctest.h>
#include <kj/async-io.h>

#include "actors/tls/kj_tls.hpp"
#include "tests/actors/tls_clusters.hpp"

namespace troupe {

namespace {

using test::clusters;

struct loop {
  kj::AsyncIoContext io = kj::setupAsyncIo();
};

// Both ends' streams once both handshakes are done, or each side's failure.
struct handshake_result {
  kj::Own<kj::AsyncIoStream> server, client;
  std::string server_error, client_error;
};

handshake_result shake(loop& l, const tls::endpoint_context* server_ctx, const tls::endpoint_context* client_ctx,
                       const std::string& host = "127.0.0.1") {
  auto pipe = l.io.provider->newTwoWayPipe();
  handshake_result r;
  auto on_error = [](std::string& out) { return [&out](kj::Exception&& e) { out = e.getDescription().cStr(); }; };
  kj::Promise<void> s = server_ctx ? tls::accept_tls(*server_ctx, kj::mv(pipe.ends[0]))
                                         .then([&](kj::Own<kj::AsyncIoStream> st) { r.server = kj::mv(st); }, on_error(r.server_error))
                                   : kj::Promise<void>(kj::READY_NOW);
  kj::Promise<void> c = client_ctx ? tls::connect_tls(*client_ctx, kj::mv(pipe.ends[1]), host)
                                         .then([&](kj::Own<kj::AsyncIoStream> st) { r.client = kj::mv(st); }, on_error(r.client_error))
                                   : kj::Promise<void>(kj::READY_NOW);
  if (!client_ctx) {  // a plain client: bytes that are not TLS, then its end
    auto& end = *pipe.ends[1];
    c = end.write("GET / HTTP/1.1\r\n\r\n", 18).then([&end] { end.shutdownWrite(); }).attach(kj::mv(pipe.ends[1]));
  }
  kj::joinPromises(kj::arr(kj::mv(s), kj::mv(c))).wait(l.io.waitScope);
  return r;
}

}  // namespace

TEST_CASE("capnps streams: bytes both ways over TLS, in pieces, to the end") {
  clusters c;
  auto server = tls::endpoint_context::server(c.path("a1", "pem"), c.path("a1", "key"));
  auto client = tls::endpoint_context::client(c.path("a", "pem"));
  REQUIRE(server.has_value());
  REQUIRE(client.has_value());
  loop l;
  auto r = shake(l, server->get(), client->get());
  CAPTURE(r.server_error);
  CAPTURE(r.client_error);
  REQUIRE(r.server.get() != nullptr);
  REQUIRE(r.client.get() != nullptr);

  // 1 MiB from the client, 3 bytes back: several records, read in pieces.
  std::string big(1 << 20, 'x');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>('a' + i % 26);
  auto sent = r.client->write(big.data(), big.size());
  std::string got(big.size(), '\0');
  const size_t n = r.server->tryRead(got.data(), got.size(), got.size()).wait(l.io.waitScope);
  sent.wait(l.io.waitScope);
  CHECK(n == big.size());
  CHECK(got == big);
  r.server->write("yes", 3).wait(l.io.waitScope);
  char back[3];
  CHECK(r.client->tryRead(back, 3, 3).wait(l.io.waitScope) == 3);
  CHECK(std::string(back, 3) == "yes");

  // The end of the stream: close_notify then the socket's end reads as 0 bytes.
  r.client->shutdownWrite();
  char one;
  CHECK(r.server->tryRead(&one, 1, 1).wait(l.io.waitScope) == 0);
}

TEST_CASE("capnps handshakes: an untrusted certificate, another host's, and a client without TLS") {
  clusters c;
  auto server = tls::endpoint_context::server(c.path("a1", "pem"), c.path("a1", "key"));
  REQUIRE(server.has_value());
  loop l;
  SUBCASE("a client that trusts another CA") {
    auto other = tls::endpoint_context::client(c.path("b", "pem"));
    REQUIRE(other.has_value());
    auto r = shake(l, server->get(), other->get());
    CHECK(r.client.get() == nullptr);
    CHECK(r.client_error.find("the gateway's certificate is not trusted") != std::string::npos);
    CHECK(!r.server_error.empty());
  }
  SUBCASE("a certificate for another host") {
    auto client = tls::endpoint_context::client(c.path("a", "pem"));
    REQUIRE(client.has_value());
    auto r = shake(l, server->get(), client->get(), "10.9.8.7");
    CHECK(r.client.get() == nullptr);
    CHECK(r.client_error.find("not trusted") != std::string::npos);
  }
  SUBCASE("plain bytes") {
    auto r = shake(l, server->get(), nullptr);
    CHECK(r.server.get() == nullptr);
    CHECK(r.server_error.find("does not speak TLS") != std::string::npos);
  }
  SUBCASE("files that are not a certificate and its key") {
    auto swapped = tls::endpoint_context::server(c.path("a1", "pem"), c.path("a2", "key"));
    REQUIRE(!swapped);
    CHECK(swapped.err().message.find("not the key of") != std::string::npos);
    auto missing = tls::endpoint_context::client(c.path("nowhere", "pem"));
    CHECK(!missing);
  }
}

}  // namespace troupe
