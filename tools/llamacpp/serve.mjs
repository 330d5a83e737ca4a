#!/usr/bin/env node
// llama.cpp's side of `headcount bench serve` (src/headcount/engines/llamacpp_engine.py): one GGUF, one prompt
// served to `batch` sequences of one context at once, greedy, llama.cpp's f16 KV cache by default.
//
//   node serve.mjs MODEL.gguf REQUEST.json
//
// REQUEST: {"prompt": [ids...], "batch": 1, "new_tokens": 33, "threads": 2, "kv": "f16" | "f32", "batch_size": 512}
//
// Prints one JSON object on stdout:
//   state_empty_bytes   llama.cpp's context state (llama_state_get_size) before any token: logits and bookkeeping
//   state_bytes         the same once every sequence holds its prompt and new tokens: the KV cells in use join it
//   kv_bytes            state_bytes - state_empty_bytes: the KV cache those tokens take, as llama.cpp serialises it
//   prefill_s           the prompt through every sequence, to the first new token of each (the sequences batched)
//   decode_s            the remaining new_tokens - 1 steps, one token of every sequence per step
//   tokens              each sequence's new tokens; peak_rss_bytes (this process's VmHWM); versions
// Errors: one line on stderr, exit status 2.

import fs from "node:fs";
import process from "node:process";

function fail(message) {
    process.stderr.write(`serve.mjs: ${message}\n`);
    process.exit(2);
}

const args = process.argv.slice(2);
if (args.length !== 2) fail("usage: node serve.mjs MODEL.gguf REQUEST.json");
const [modelPath, requestPath] = args;
if (!fs.existsSync(modelPath)) fail(`${modelPath}: no such file`);
let request;
try {
    request = JSON.parse(fs.readFileSync(requestPath, "utf8"));
} catch (e) {
    fail(`the request is not JSON: ${e.message}`);
}
const prompt = request.prompt ?? [];
const batch = request.batch ?? 1;
const newTokens = request.new_tokens ?? 33;
const threads = request.threads ?? 2;
const kv = request.kv ?? "f16";
if (!Array.isArray(prompt) || prompt.length < 1 || !prompt.every((t) => Number.isInteger(t) && t >= 0))
    fail("prompt: expected a non-empty list of token ids");
if (!Number.isInteger(batch) || batch < 1) fail(`batch: expected a positive integer, got ${JSON.stringify(batch)}`);
if (!Number.isInteger(newTokens) || newTokens < 2) fail(`new_tokens: expected an integer >= 2, got ${newTokens}`);
if (!["f32", "f16"].includes(kv)) fail(`kv: expected "f32" or "f16", got ${JSON.stringify(kv)}`);

let nlc;
try {
    nlc = await import("node-llama-cpp");
} catch (e) {
    fail(`node-llama-cpp is not installed (\`make llamacpp\`): ${e.message.split("\n")[0]}`);
}
const {getLlama, LlamaLogLevel} = nlc;

function peakRss() {
    const m = fs.readFileSync("/proc/self/status", "utf8").match(/VmHWM:\s+(\d+) kB/);
    return m ? Number(m[1]) * 1024 : null;
}

let llama, model, context;
try {
    llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error, progressLogs: false,
                            maxThreads: threads});
} catch (e) {
    fail(`llama.cpp's prebuilt binary did not load: ${e.message.split("\n")[0]}`);
}
try {
    model = await llama.loadModel({modelPath, gpuLayers: 0});
} catch (e) {
    await new Promise((resolve) => setTimeout(resolve, 200));
    fail(`llama.cpp could not load ${modelPath}: ${e.message.split("\n")[0]}`);
}
const perSequence = prompt.length + newTokens + 8;
const kvType = kv === "f32" ? "F32" : "F16";
try {
    context = await model.createContext({
        contextSize: perSequence, sequences: batch, batchSize: request.batch_size ?? 512, threads,
        flashAttention: false, experimentalKvCacheKeyType: kvType, experimentalKvCacheValueType: kvType,
        ignoreMemorySafetyChecks: true,
    });
} catch (e) {
    fail(`llama.cpp could not create a context of ${batch} x ${perSequence} tokens: ${e.message.split("\n")[0]}`);
}
const sequences = Array.from({length: batch}, () => context.getSequence());
const greedy = {temperature: 0};
const stateEmpty = context.stateSize;
const tokens = sequences.map(() => []);

async function step(seq, i, input) {
    const out = await seq.controlledEvaluate(input);
    const token = out[input.length - 1]?.next?.token;
    if (token == null) throw new Error(`no token for sequence ${i}`);
    tokens[i].push(token);
    return token;
}

let prefill, decode;
try {
    const t0 = performance.now();
    // every sequence's prompt queued in the same cycle: node-llama-cpp batches them into llama.cpp's decode calls
    const first = prompt.map((t, j) => j === prompt.length - 1 ? [t, {generateNext: {token: true, options: greedy}}] : t);
    let last = await Promise.all(sequences.map((s, i) => step(s, i, first)));
    const t1 = performance.now();
    for (let k = 1; k < newTokens; k++)
        last = await Promise.all(sequences.map((s, i) => step(s, i, [[last[i], {generateNext: {token: true, options: greedy}}]])));
    const t2 = performance.now();
    prefill = (t1 - t0) / 1000;
    decode = (t2 - t1) / 1000;
} catch (e) {
    fail(`llama.cpp evaluation failed: ${e.message.split("\n")[0]}`);
}
const state = context.stateSize;
let nlcVersion = null;
try {
    nlcVersion = JSON.parse(fs.readFileSync(new URL("./node_modules/node-llama-cpp/package.json", import.meta.url), "utf8")).version;
} catch {}
process.stdout.write(JSON.stringify({
    model: modelPath, context: prompt.length, batch, new_tokens: newTokens, kv, threads,
    state_empty_bytes: stateEmpty, state_bytes: state, kv_bytes: state - stateEmpty,
    prefill_s: prefill, decode_s: decode, tokens, peak_rss_bytes: peakRss(),
    versions: {"node-llama-cpp": nlcVersion, "llama.cpp": llama.llamaCppRelease?.release ?? null,
               architecture: model.fileInfo?.metadata?.general?.architecture ?? null},
}) + "\n");
await context.dispose();
await model.dispose();
await llama.dispose();
