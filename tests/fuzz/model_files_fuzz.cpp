// The checkpoint loaders, given any bytes: a GGUF file (selector 0), a llama2.c checkpoint
// (1), a safetensors file (2), a Hugging Face config.json (3) or a head file of speculative
// decoding, for a small model (4: heads_target.hpp). Each either loads or says why not; a
// model that loads has a vocabulary a tokenizer accepts.
#include <string>

#include "engine/model/hf_config.hpp"
#include "engine/model/model.hpp"
#include "engine/model/safetensors_file.hpp"
#include "engine/speculative/heads.hpp"
#include "engine/tokenizer/tokenizer.hpp"
#include "tests/fuzz/fuzz_input.hpp"
#include "tests/fuzz/heads_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace troupe;
  fuzz::input in;
  if (!fuzz::split(data, size, 5, in)) return 0;
  switch (in.selector) {
    case 0: {
      auto m = load_gguf(mapped_file::copy_of(in.rest, "input.gguf"));
      if (m && m->vocab) {
        const tokenizer tok(*m->vocab);
        (void)tok.decode_all(tok.encode("Once upon a time, \xe4\xb8\x96\xe7\x95\x8c!", true));
      }
      break;
    }
    case 1: (void)load_llama2c(mapped_file::copy_of(in.rest, "input.bin")); break;
    case 2: (void)safetensors_file::parse(mapped_file::copy_of(in.rest, "input.safetensors")); break;
    case 3: (void)parse_hf_config(in.text(), "config.json"); break;
    case 4: {
      static const model target = fuzz::heads_target();
      (void)load_heads(mapped_file::copy_of(in.rest, "heads.gguf"), target, &fuzz::heads_vocabulary());
      break;
    }
  }
  return 0;
}
