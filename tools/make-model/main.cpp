// make-model: writes Llama checkpoints of any shape with seeded random weights (or
// converts a model troupe can load), in llama2.c or GGUF format, for benchmarks and tests
// at sizes that cannot be shipped.
#include <CLI/CLI.hpp>

#include "tools/make-model/make_options.hpp"

using namespace troupe;

int main(int argc, char** argv) {
  CLI::App app{
      "make-model: write a Llama-family checkpoint with seeded random weights, or convert one.\n\n"
      "Formats: llama2c (f32 writes the legacy format, q8_0 version 2), gguf (f32, f16, bf16,\n"
      "q8_0; the vocabulary goes into the file) and hf (a Hugging Face directory: config.json,\n"
      "model.safetensors in f32, f16 or bf16, and the vocabulary as tokenizer.bin). Families:\n"
      "llama2, llama3, qwen2, mistral. The same seed gives the same weights in every format,\n"
      "so formats can be compared against each other.\n\n"
      "Examples:\n"
      "  make-model syn110m.gguf --preset 110m --type q8_0 --vocab-from tokenizer.bin\n"
      "  make-model tiny.bin --dim 64 --hidden 96 --layers 2 --heads 4 --vocab 300\n"
      "  make-model stories.f16.gguf --from stories260K.bin -z tok512.bin --type f16\n"
      "  make-model qwen-tiny --family qwen2 --format hf --dim 128 --hidden 256 --layers 2 --heads 8 --kv-heads 2\n"
      "  make-model stories_q8_g32.bin --from stories260K.bin --type q8_0 --group-size 32 --pad-ffn 192\n",
      "make-model"};
  tools::make_options o;
  tools::add_make_options(app, o);
  CLI11_PARSE(app, argc, argv);
  if (!o.heads_from.empty()) return tools::pack_heads(o);
  return tools::make_checkpoint(o, app);
}
