// Uses the official openai package against troupe's HTTP API and prints what it got as
// JSON: a completion, one of two prompts at once, a chat completion, and a streamed chat
// completion.
// Usage: node openai_client.mjs BASE_URL API_KEY MODEL
import OpenAI from 'openai';

const [base, key, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: key, maxRetries: 0, timeout: 60000 });

const completion = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 40, temperature: 0 });
const several = await client.completions.create({
  model, prompt: ['Once upon a time', 'The cat sat'], max_tokens: 40, temperature: 0,
});
const chat = await client.chat.completions.create({
  model, messages: [{ role: 'user', content: 'Once upon a time' }], max_tokens: 24, temperature: 0,
});
let streamed = '';
let usage = null;
const stream = await client.chat.completions.create({
  model, messages: [{ role: 'user', content: 'Once upon a time' }], max_tokens: 24, temperature: 0,
  stream: true, stream_options: { include_usage: true },
});
for await (const chunk of stream) {
  streamed += chunk.choices[0]?.delta?.content ?? '';
  if (chunk.usage) usage = chunk.usage;
}
const models = await client.models.list();
console.log(JSON.stringify({
  completion: completion.choices[0].text,
  completion_tokens: completion.usage.completion_tokens,
  several: several.choices.map((c) => [c.index, c.text]),
  chat: chat.choices[0].message.content,
  streamed,
  stream_usage: usage,
  models: models.data.map((m) => m.id),
}));
