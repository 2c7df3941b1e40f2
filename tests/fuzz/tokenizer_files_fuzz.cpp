// The tokenizer files, given any bytes: a llama2.c tokenizer.bin (selector 0, the
// vocabulary size from the next two bytes), a Hugging Face tokenizer.json with the
// tokenizer_config.json beside it (1: the two texts split at the first NUL) and a
// SentencePiece model (2). A vocabulary that loads builds a tokenizer, which encodes and
// decodes text.
#include <algorithm>
#include <string>
#include <string_view>

#include "engine/tokenizer/sentencepiece_model.hpp"
#include "engine/tokenizer/tokenizer.hpp"
#include "engine/tokenizer/tokenizer_json.hpp"
#include "engine/tokenizer/vocabulary.hpp"
#include "tests/fuzz/fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace troupe;
  fuzz::input in;
  if (!fuzz::split(data, size, 3, in)) return 0;
  expected<vocabulary> v = error{"none"};
  switch (in.selector) {
    case 0: {
      if (in.rest.size() < 2) return 0;
      const int32_t vocab_size = in.rest[0] | (in.rest[1] << 8);
      v = parse_llama2c_vocabulary(mapped_file::copy_of(in.rest.subspan(2), "tokenizer.bin"), vocab_size);
      break;
    }
    case 1: {
      const std::string_view text = in.text();
      const size_t nul = std::min(text.find('\0'), text.size());
      v = parse_tokenizer_json(text.substr(0, nul), nul < text.size() ? text.substr(nul + 1) : std::string_view{},
                               "tokenizer.json");
      break;
    }
    case 2: v = parse_sentencepiece_model(in.text(), "tokenizer.model"); break;
  }
  if (v) {
    const tokenizer tok(std::move(*v));
    (void)tok.decode_all(tok.encode(" Hello, world! 123 \xf0\x9f\x98\x80 <s>\n\tend", true));
  }
  return 0;
}
