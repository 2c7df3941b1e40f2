// HTTP/1.1 request heads and bodies as the gateway reads them off a connection
// (actors/gateway/http_reader), in pieces as the network delivers them: the selector picks
// the piece size (1, 2, 3, 5, 8, 16, 64 or 4096 bytes). Every outcome is a whole request
// within the limits, more wanted, or a refusal with a 4xx the server sends as it is.
#include <algorithm>
#include <string>

#include "actors/gateway/http_reader.hpp"
#include "tests/fuzz/fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace troupe;
  fuzz::input in;
  if (!fuzz::split(data, size, 8, in)) return 0;
  static constexpr size_t pieces[] = {1, 2, 3, 5, 8, 16, 64, 4096};
  const size_t piece = pieces[in.selector];
  const std::string_view text = in.text();
  http::request_reader::limits lim;
  lim.max_head_bytes = 1024;  // small, so that inputs reach them
  lim.max_body_bytes = 4096;
  http::request_reader r(lim);
  size_t at = 0;
  for (;;) {
    if (at < text.size()) {
      const size_t n = std::min(piece, text.size() - at);
      r.add(text.substr(at, n));
      at += n;
    }
    const auto st = r.step();
    if (st == http::request_reader::state::refused) {
      const int s = r.why().status;
      if ((s != 400 && s != 413 && s != 431) || r.why().message.empty()) __builtin_trap();
      break;
    }
    if (st == http::request_reader::state::request) {
      bool keep_alive = false;
      const http::request q = r.take(keep_alive);
      if (q.method.empty() || q.body.size() > lim.max_body_bytes || q.target.rfind(q.path, 0) != 0) __builtin_trap();
      if (q.version != 10 && q.version != 11) __builtin_trap();
      (void)q.header("Content-Length");
      continue;
    }
    (void)r.wants_continue();
    if (r.buffered() > text.size()) __builtin_trap();  // it holds no more than it was given
    if (at >= text.size()) break;
  }
  return 0;
}
