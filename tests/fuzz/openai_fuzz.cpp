// The OpenAI API's request bodies, given any text: a completion (selector 0), a chat
// completion (1), /tokenize (2) and /detokenize (3). Each is a request or an error; a
// completion's refusal must be a 4xx (the client's fault, never the server's).
#include <string>

#include "actors/gateway/openai.hpp"
#include "tests/fuzz/fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace troupe;
  fuzz::input in;
  if (!fuzz::split(data, size, 4, in)) return 0;
  const std::string body(in.text());
  openai::api_limits lim;
  lim.context = 512;
  switch (in.selector) {
    case 0:
    case 1: {
      const bool chat = in.selector == 1;
      auto got = openai::parse_request(body, chat, "m", openai::chat_template::chatml, lim);
      if (const auto* e = std::get_if<openai::api_error>(&got)) {
        if (e->status < 400 || e->status > 499) __builtin_trap();  // bad input is the client's error
        (void)openai::error_body(*e);
      }
      break;
    }
    case 2: (void)openai::parse_tokenize(body, "m", openai::chat_template::llama3, lim); break;
    case 3: (void)openai::parse_detokenize(body, "m", 512); break;
  }
  return 0;
}
