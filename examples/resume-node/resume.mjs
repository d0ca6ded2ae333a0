// Streams a chat completion from Lifeline with the official OpenAI Node
// SDK and, when the frontend serving it dies, resumes the stream at
// another frontend after the last token it printed: no token lost, none
// twice. The recipe is the Go example's (examples/resume-go):
//
//  1. ask for a resumable stream (stream_options.resumable) and keep the
//     Lifeline-Request-Id and Lifeline-Resume-Token response headers;
//  2. remember the last token's sequence number (chunk.lifeline.sequence_no);
//  3. when the stream breaks, GET /v1/streams/{id} at any frontend with
//     Last-Event-ID and the token as the bearer credential, and read on.
//
// Usage: npm install && node resume.mjs --urls http://127.0.0.1:8080,http://127.0.0.1:8081
import OpenAI from 'openai';
import { Stream } from 'openai/streaming';
import { parseArgs } from 'node:util';

const { values: a } = parseArgs({
  options: {
    urls: { type: 'string', default: 'http://127.0.0.1:8080' },
    model: { type: 'string', default: 'small' },
    prompt: { type: 'string', default: 'Tell me a story.' },
    'max-tokens': { type: 'string', default: '64' },
    seed: { type: 'string', default: '1' },
    'ignore-eos': { type: 'boolean', default: false }, // a Lifeline extension, for demos and tests
  },
});
const urls = a.urls.split(',');
const client = new OpenAI({ baseURL: `${urls[0]}/v1`, apiKey: process.env.OPENAI_API_KEY ?? 'unused', maxRetries: 0 });

// 1. A resumable stream; its id and resume token are in the headers.
const body = {
  model: a.model, messages: [{ role: 'user', content: a.prompt }], max_tokens: Number(a['max-tokens']),
  seed: Number(a.seed), stream: true, stream_options: { resumable: true },
};
if (a['ignore-eos']) body.ignore_eos = true;
const { data, response } = await client.chat.completions.create(body).withResponse();
const id = response.headers.get('lifeline-request-id');
const token = response.headers.get('lifeline-resume-token');

let stream = data;
let last = 0;
for (let attempt = 1; ; attempt++) {
  try {
    for await (const chunk of stream) {
      process.stdout.write(chunk.choices[0]?.delta?.content ?? '');
      // 2. The last sequence number printed.
      if (chunk.lifeline?.sequence_no > 0) last = chunk.lifeline.sequence_no;
    }
    process.stdout.write('\n');
    break;
  } catch (err) {
    if (attempt > 3 * urls.length) throw err;
    // 3. Resume at another frontend after the last sequence number.
    const next = urls[attempt % urls.length];
    console.error(`resume-node: stream broke (${err.message}); resuming at ${next} after ${last}`);
    stream = await resume(next, last).catch((e) => failing(e));
  }
}

async function resume(url, after) {
  const controller = new AbortController();
  const res = await fetch(`${url}/v1/streams/${id}`, {
    headers: { 'Last-Event-ID': String(after), Authorization: `Bearer ${token}` },
    signal: controller.signal,
  });
  if (!res.ok) throw new Error(`${res.status}: ${await res.text()}`);
  return Stream.fromSSEResponse(res, controller);
}

// failing is a stream that throws err: the loop tries the next frontend.
function failing(err) {
  return { async *[Symbol.asyncIterator]() { throw err; } };
}
