// http_server: an event-driven HTTP/1.1 server. One thread runs every connection's I/O
// (Boost.Asio's reactor, with Boost.Beast's parser reading requests); a fixed few run the
// handlers. A connection costs its socket and a small record; a buffer only while a request
// arrives or an answer leaves. However many connections there are, the threads stay the
// same.
//
// What it guarantees each connection:
//  - a request (head and body) must arrive whole within read_timeout from its first byte,
//    or it is answered 408 and closed (slowloris, floods of half requests); a declared body
//    over the limit is answered 413 before any of it is read; a head that is not HTTP, 400;
//  - between requests a connection may idle for idle_timeout, then it is closed quietly;
//  - at max_connections, a newcomer takes the place of the connection that has waited
//    longest for its request (answered 408): idle connections cannot crowd out clients;
//  - keep-alive and pipelining: requests on one connection are answered in order; what a
//    client sends ahead is read (up to a bound) while the answer before it is made;
//  - a client that half-closes its socket after a whole request (HTTP/1.0 style, or
//    shutdown(SHUT_WR)) still gets its answer; one that has closed it wholly is found gone
//    (an HTTP/1.1 client is sent an interim "100 Continue" to tell the two apart, which
//    HTTP/1.1 clients must accept), and so is one that resets it;
//  - a streamed answer is written as it is produced; a reader that falls max_stream_buffer
//    behind, or takes write_timeout to accept any of it, is gone: the stream ends and the
//    connection is closed, so a slow reader never holds unbounded memory;
//  - stop() drains: no new connections, idle ones closed, answers in flight finished (up
//    to a bound), each with "Connection: close".
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "engine/util/expected.hpp"

typedef struct ssl_ctx_st SSL_CTX;

namespace troupe::http {

struct header_field {
  std::string name, value;
};

struct request {
  std::string method, target, path;  // path: the target without its query
  unsigned version = 11;             // 10 or 11
  std::vector<header_field> headers;
  std::string body;
  std::string peer;  // "ADDRESS:PORT"

  // A header's value by its name, in any case ("" where it is absent).
  std::string header(std::string_view name) const;
  bool has(std::string_view name) const;
};

struct response {
  int status = 200;
  std::vector<header_field> headers;
  std::string body;

  // Replaces the header of that name (in any case), or adds it.
  void set(std::string_view name, std::string value);
  std::string header(std::string_view name) const;
};

// The reason phrase of a status ("" for one it does not know).
std::string_view reason_phrase(int status);

// One request and its answer, handed to the handler. Every call may come from any thread.
class exchange {
 public:
  virtual ~exchange() = default;
  virtual const request& req() const = 0;
  // The whole answer (once; a Content-Length is added).
  virtual void respond(response r) = 0;
  // A streamed answer: the head now (status and headers; chunked over HTTP/1.1, to the
  // connection's end over HTTP/1.0), then write() as it comes, then end_stream().
  virtual void begin_stream(response head) = 0;
  // Whether the bytes were queued: false once the client is gone or has fallen
  // max_stream_buffer behind (then the stream is over and the connection closed).
  virtual bool write(std::string bytes) = 0;
  virtual void end_stream() = 0;
  // fn runs once, on the server's I/O thread (or at once, here, if it already happened),
  // when the client is found gone before its answer has been written: reset, closed,
  // reading too slowly, or the server stopping. It must not block.
  virtual void on_gone(std::function<void()> fn) = 0;
  virtual bool gone() const = 0;
};

using handler = std::function<void(std::shared_ptr<exchange>)>;

struct server_config {
  std::string host = "127.0.0.1";
  uint16_t port = 0;  // 0: any free port
  size_t max_connections = 16384;
  size_t max_head_bytes = 64 * 1024;
  size_t max_body_bytes = size_t{1} << 20;
  std::chrono::milliseconds read_timeout{30000};   // a request, from its first byte
  std::chrono::milliseconds idle_timeout{60000};   // between requests
  std::chrono::milliseconds write_timeout{30000};  // an answer that makes no progress
  size_t max_stream_buffer = 1 << 20;  // a stream's bytes written and not yet sent
  size_t handler_threads = 4;
  SSL_CTX* tls = nullptr;  // HTTPS when set (held by the caller while the server runs)
  std::chrono::milliseconds tls_handshake_timeout{5000};
  // The answer to a request the server refuses itself (400, 408, 413, 431, 503): its body
  // and content type from the status and a message.
  std::function<response(int status, const std::string& message, const std::string& code)> error_page;
  // Told of connections closed for want of a whole request in time, or to make room, and
  // of refused TLS handshakes (one line at most every ten seconds).
  std::function<void(const std::string& line)> log;
  // Told, on the I/O thread, of each connection: +1 opened, -1 closed, 0 closed to make
  // room (then -1 as well).
  std::function<void(int change)> on_connection;
  // Told, on the I/O thread, of each stream ended for a reader that fell behind.
  std::function<void()> on_slow_reader;
};

// Counts since start, and what is open now.
struct server_stats {
  int64_t open = 0;         // connections
  int64_t streaming = 0;    // streamed answers being written
  uint64_t accepted = 0;
  uint64_t timed_out = 0;   // answered 408: no whole request in read_timeout
  uint64_t shed = 0;        // answered 408 to make room
  uint64_t slow_readers = 0;  // streams ended for a reader that fell behind
  uint64_t half_closed = 0;   // clients that shut their sending half while an answer was owed
  uint64_t refused_tls = 0;   // TLS handshakes that failed or did not finish in time
  size_t threads = 0;       // the server's, all of them
};

class server {
 public:
  server(server_config cfg, handler h);
  ~server();
  server(const server&) = delete;
  server& operator=(const server&) = delete;

  // Listens and starts the threads; the port.
  expected<uint16_t> start();
  // Stops accepting, closes connections that wait for a request, lets answers in flight
  // finish for up to `drain`, then closes the rest and joins the threads.
  void stop(std::chrono::milliseconds drain = std::chrono::seconds(10));

  server_stats stats() const;

  struct impl;

 private:
  std::shared_ptr<impl> impl_;
};

}  // namespace troupe::http
