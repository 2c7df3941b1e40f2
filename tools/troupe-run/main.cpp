// troupe-run: generate text from a checkpoint on this machine's CPU, printing it as it is
// produced. The composition root of a single-process engine: model, tokenizer, generator.
#include <CLI/CLI.hpp>

#include "tools/troupe-run/run_options.hpp"

using namespace troupe;

int main(int argc, char** argv) {
  CLI::App app{
      "troupe-run: generate text from a Llama-family checkpoint on the CPU.\n\n"
      "Reads llama2.c checkpoints (legacy f32 and version-2 Q8_0), GGUF files (F32, F16, BF16,\n"
      "Q8_0 weights; llama and qwen2 architectures) and Hugging Face model directories\n"
      "(config.json and safetensors: Llama 2 and 3, Mistral, Qwen2), weights used in place.\n"
      "The prompt is echoed, then the continuation is printed as it is produced. BOS is\n"
      "prepended; generation stops at EOS or BOS, at a stop string, or when the sequence\n"
      "reaches STEPS tokens.\n\n"
      "Examples:\n"
      "  troupe-run stories260K.bin -z tok512.bin -p \"Once upon a time\" -t 0\n"
      "  troupe-run model.gguf -p \"The answer is\" -n 128 -t 0.8 --top-p 0.95 --seed 7\n"
      "  troupe-run model.gguf -p \"...\" --speculative draft --draft small.gguf -k 4\n"
      "  troupe-run model.gguf -p \"...\" --speculative medusa --heads model-medusa.gguf\n\n"
      "Environment: TROUPE_KV_TYPE=f32|f16|q8_0 sets the KV cache's type (default: F32 for F32\n"
      "weights, F16 otherwise; q8_0 is int8 with a scale per token and KV head, lossy).\n",
      "troupe-run"};
  tools::run_options o;
  tools::add_run_options(app, o);
  CLI11_PARSE(app, argc, argv);
  return tools::run(o);
}
