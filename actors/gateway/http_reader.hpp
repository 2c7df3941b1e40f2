// http_reader: HTTP/1.1 requests out of a connection's bytes, one after another, with
// Boost.Beast's parser. No sockets and no clock: the server (http_server) feeds it what it
// reads and acts on what it says; the tests and the fuzzer feed it anything.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "actors/gateway/http_server.hpp"

namespace troupe::http {

class request_reader {
 public:
  struct limits {
    size_t max_head_bytes = 64 * 1024;
    size_t max_body_bytes = size_t{1} << 20;
  };
  // What the bytes so far make.
  enum class state {
    need_more,  // a request begun (or none) and not whole yet
    request,    // a whole request: take() it
    refused,    // not a request this server takes: answer refusal(), then close
  };
  struct refusal {
    int status = 400;  // 400 not HTTP or a bad length, 413 body too large, 431 head too large
    std::string message;
  };

  explicit request_reader(limits l);
  ~request_reader();
  request_reader(const request_reader&) = delete;
  request_reader& operator=(const request_reader&) = delete;

  // Bytes read from the connection, kept until a request is whole.
  void add(std::string_view bytes);
  // Parses what it can. After `request`, take() it before calling again; after `refused`,
  // the connection is done (nothing more is parsed).
  state step();
  // The whole request; keep_alive says whether the client will send more on the connection.
  request take(bool& keep_alive);
  const refusal& why() const;
  // Once per request: whether the client asked to hear "100 Continue" before it sends its
  // body, and has not been told yet (its head is whole, the body not).
  bool wants_continue();
  // Bytes held: of a request begun, or sent ahead (pipelining).
  size_t buffered() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace troupe::http
