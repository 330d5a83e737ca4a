#!/usr/bin/env node
// Score token ids with llama.cpp (node-llama-cpp's prebuilt CPU binaries): no sampling, no BOS added.
//
//   node score.mjs MODEL.gguf [REQUEST.json]        (the request is read from stdin when no file is given)
//
// REQUEST: a JSON list of token ids, or an object
//   {"windows": [[ids...], ...],   // each window is evaluated from an empty context, like
//                                   // `headcount perplexity`'s non-overlapping windows
//    "tokens": [ids...],            // shorthand for one window
//    "prompt": [ids...],            // greedy continuation from these ids (default: none)
//    "greedy": 32,                  // how many greedy tokens to produce after `prompt`
//    "threads": 2,
//    "chunk": 64,                   // tokens per evaluation call (bounds the probability lists held)
//    "kv": "f32"}                   // KV cache type: "f32" (default: the same math as an fp32 model) or "f16"
//                                   // (llama.cpp's own default)
//
// Prints one JSON object on stdout:
//   logprobs[w][j]  log p(window[w][j+1] | window[w][0..j])   (natural log; j = 0 .. len-2)
//   argmax[w][j]    the most likely token after window[w][0..j]
//   greedy          `greedy` tokens chosen greedily after `prompt`, each fed back
//   n_vocab (entries in llama.cpp's probability list), kv, seconds, versions.
// `node score.mjs --check` only loads llama.cpp's binary and prints the versions (exit 2 when it cannot).
// llama.cpp returns probabilities, not log-probabilities: node-llama-cpp's addon softmaxes the full
// vocabulary's f32 logits in f32 (AddonContext.cpp, SampleToken); they are renormalised here in f64
// (their f32 sum misses the vocabulary's tail: max_renormalisation = the largest |log(sum)| corrected)
// and the log taken in f64.
// Errors: one line on stderr, exit status 2.

import fs from "node:fs";
import process from "node:process";

function fail(message) {
    process.stderr.write(`score.mjs: ${message}\n`);
    process.exit(2);
}

const args = process.argv.slice(2);
if (args.length < 1 || args.length > 2 || args[0] === "--help" || args[0] === "-h") {
    process.stderr.write("usage: node score.mjs MODEL.gguf [REQUEST.json]   (request on stdin when no file)\n");
    process.exit(args[0] === "--help" || args[0] === "-h" ? 0 : 2);
}
const check = args[0] === "--check";  // only load llama.cpp's binary and print the versions
const modelPath = args[0];
if (!check && !fs.existsSync(modelPath)) fail(`${modelPath}: no such file`);

let request = {};
try {
    if (!check) request = JSON.parse(fs.readFileSync(args.length === 2 ? args[1] : 0, "utf8"));
} catch (e) {
    fail(`the request is not JSON: ${e.message}`);
}
if (Array.isArray(request)) request = {tokens: request};
const windows = request.windows ?? (request.tokens ? [request.tokens] : []);
const prompt = request.prompt ?? [];
const nGreedy = request.greedy ?? (prompt.length ? 32 : 0);
const threads = request.threads ?? 2;
const kv = request.kv ?? "f32";
const chunk = request.chunk ?? 64;
if (!["f32", "f16"].includes(kv)) fail(`kv: expected "f32" or "f16", got ${JSON.stringify(kv)}`);
const isIds = (xs) => Array.isArray(xs) && xs.every((t) => Number.isInteger(t) && t >= 0);
if (!windows.every(isIds) || !isIds(prompt)) fail("token ids must be lists of non-negative integers");
if (windows.some((w) => w.length < 2)) fail("every window needs at least 2 tokens");
if (nGreedy > 0 && prompt.length === 0) fail("greedy tokens need a non-empty prompt");
if (!Number.isInteger(chunk) || chunk < 1) fail(`chunk: expected a positive integer, got ${JSON.stringify(chunk)}`);

let nlc;
try {
    nlc = await import("node-llama-cpp");
} catch (e) {
    fail(`node-llama-cpp is not installed (run \`npm install\` in tools/llamacpp): ${e.message.split("\n")[0]}`);
}
const {getLlama, LlamaLogLevel} = nlc;

const started = performance.now();
let llama;
try {
    // build: "never": use the prebuilt CPU binary that came with the npm package, never compile or download
    llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error, progressLogs: false,
                            maxThreads: threads});
} catch (e) {
    fail(`llama.cpp's prebuilt binary did not load: ${e.message.split("\n")[0]}`);
}
function versions() {
    let nlcVersion = null;
    try {
        const pkg = new URL("./node_modules/node-llama-cpp/package.json", import.meta.url);
        nlcVersion = JSON.parse(fs.readFileSync(pkg, "utf8")).version;
    } catch {}
    return {"node-llama-cpp": nlcVersion, "llama.cpp": llama.llamaCppRelease?.release ?? null,
            build: llama.buildType, node: process.version};
}
if (check) {
    process.stdout.write(JSON.stringify(versions()) + "\n");
    await llama.dispose();
    process.exit(0);
}
let model;
try {
    model = await llama.loadModel({modelPath, gpuLayers: 0});
} catch (e) {
    // llama.cpp's own reason ("check_tensor_dims: tensor ... has wrong shape") reaches stderr through the
    // addon's log callback, asynchronously: let it through before exiting
    await new Promise((resolve) => setTimeout(resolve, 200));
    fail(`llama.cpp could not load ${modelPath}: ${e.message.split("\n")[0]}`);
}
const longest = Math.max(0, ...windows.map((w) => w.length), prompt.length + nGreedy);
const kvType = kv === "f32" ? "F32" : "F16";
let context;
try {
    context = await model.createContext({
        contextSize: Math.max(64, longest + 8), batchSize: Math.max(64, longest + 8), sequences: 1, threads,
        flashAttention: false, experimentalKvCacheKeyType: kvType, experimentalKvCacheValueType: kvType,
        ignoreMemorySafetyChecks: true,
    });
} catch (e) {
    fail(`llama.cpp could not create a context of ${longest + 8} tokens: ${e.message.split("\n")[0]}`);
}
const sequence = context.getSequence();
const greedyOptions = {temperature: 0};  // greedy: the sampler chain is the argmax alone, all logits kept

async function scoreWindow(ids) {
    // fed `chunk` tokens at a time onto the same sequence: each position's probability list is a Map over
    // the whole vocabulary (262,144 entries for Gemma 3), so only one chunk's lists are alive at once
    await sequence.clearHistory();
    const logprobs = [], argmax = [];
    for (let start = 0; start < ids.length; start += chunk) {
        const input = ids.slice(start, start + chunk).map((t, i) => start + i < ids.length - 1
            ? [t, {generateNext: {token: true, probabilities: true, options: greedyOptions}}]
            : t);
        const out = await sequence.controlledEvaluate(input);
        for (let i = 0; i < input.length && start + i < ids.length - 1; i++) {
            const j = start + i;
            const next = out[i]?.next;
            if (next == null || next.probabilities == null) fail(`llama.cpp returned no probabilities at position ${j}`);
            result.n_vocab ??= next.probabilities.size;
            // the addon normalised in f32, summing the sorted probabilities largest first, so the tail of the
            // vocabulary is lost to rounding and every probability comes out slightly too large (~1e-4 on a
            // 49k vocabulary); renormalise over the whole list in f64
            let sum = 0;
            for (const q of next.probabilities.values()) sum += q;
            result.max_renormalisation = Math.max(result.max_renormalisation, Math.abs(Math.log(sum)));
            const p = next.probabilities.get(ids[j + 1]) ?? 0;
            logprobs.push(p > 0 ? Math.log(p) - Math.log(sum) : null);  // null: underflowed to 0 (no -Infinity in JSON)
            argmax.push(next.token);
        }
    }
    return {logprobs, argmax};
}

async function greedy(ids, n) {
    await sequence.clearHistory();
    const tokens = [];
    let input = ids.map((t, j) => j === ids.length - 1 ? [t, {generateNext: {token: true, options: greedyOptions}}] : t);
    for (let i = 0; i < n; i++) {
        const out = await sequence.controlledEvaluate(input);
        const token = out[input.length - 1]?.next?.token;
        if (token == null) fail(`llama.cpp produced no token at greedy step ${i}`);
        tokens.push(token);
        input = [[token, {generateNext: {token: true, options: greedyOptions}}]];
    }
    return tokens;
}

const result = {model: modelPath, n_vocab: null, max_renormalisation: 0, kv, threads, logprobs: [], argmax: [], greedy: []};
try {
    for (const w of windows) {
        const {logprobs, argmax} = await scoreWindow(w);
        result.logprobs.push(logprobs);
        result.argmax.push(argmax);
    }
    if (nGreedy > 0) result.greedy = await greedy(prompt, nGreedy);
} catch (e) {
    fail(`llama.cpp evaluation failed: ${e.message.split("\n")[0]}`);
}
result.seconds = (performance.now() - started) / 1000;
result.versions = {...versions(), architecture: model.fileInfo?.metadata?.general?.architecture ?? null};
process.stdout.write(JSON.stringify(result) + "\n");
await context.dispose();
await model.dispose();
await llama.dispose();
