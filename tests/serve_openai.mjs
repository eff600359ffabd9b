// serve_openai.mjs - the official `openai` npm client against `qwenc serve` (run by tests/cli_serve_openai.sh,
// which installs the client and starts two servers): models, chat and completions streamed and not, usage in
// streams, the client's stream helper accumulating reasoning-free content and both tool calls of the scripted model
// (tests/serve_model.py, XML form), and the client's error classes for the server's 400 and 404.
// Prints "PASS name" or "FAIL name: detail" per check.
import { createRequire } from "node:module";

const require = createRequire(process.env.OPENAI_DIR + "/");
const { OpenAI } = require("openai");
const plain = new OpenAI({ apiKey: "none", baseURL: process.env.QWENC_URL + "/v1", maxRetries: 0, timeout: 60000 });
const tools = new OpenAI({ apiKey: "none", baseURL: process.env.TOOLS_URL + "/v1", maxRetries: 0, timeout: 60000 });
const expected = JSON.parse(process.env.EXPECTED);
const want = process.env.WANT_GREEDY;

function check(name, cond, detail) {
  console.log(cond ? `PASS ${name}` : `FAIL ${name}: ${detail}`);
}

async function run(name, fn) {
  try {
    await fn();
  } catch (e) {
    console.log(`FAIL ${name}: ${e && e.stack ? e.stack.split("\n").slice(0, 3).join(" | ") : e}`);
  }
}

const messages = [{ role: "user", content: "Tell me about the city by the sea." }];

await run("models", async () => {
  const list = await plain.models.list();
  check("models", list.data.length === 1 && list.data[0].id === "tiny-flash", JSON.stringify(list.data));
});

await run("chat", async () => {
  const r = await plain.chat.completions.create({ model: "tiny-flash", messages, max_tokens: 24, temperature: 0 });
  check("chat", r.choices[0].message.content === want && r.choices[0].finish_reason === "length" &&
    r.usage.completion_tokens === 24, JSON.stringify(r));
});

await run("chat stream", async () => {
  const stream = await plain.chat.completions.create({
    model: "tiny-flash", messages, max_tokens: 24, temperature: 0, stream: true,
    stream_options: { include_usage: true },
  });
  let text = "", usage = null, finish = null;
  for await (const c of stream) {
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) {
      text += ch.delta.content || "";
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  check("chat stream", text === want && finish === "length" && usage && usage.completion_tokens === 24 &&
    usage.prompt_tokens_details.cached_tokens > 0, JSON.stringify({ text, usage, finish }));
});

await run("completions", async () => {
  const r = await plain.completions.create({ model: "tiny-flash", prompt: "And it came to pass", max_tokens: 12,
    temperature: 0 });
  const s = await plain.completions.create({ model: "tiny-flash", prompt: "And it came to pass", max_tokens: 12,
    temperature: 0, stream: true });
  let text = "";
  for await (const c of s) text += c.choices.length ? c.choices[0].text : "";
  check("completions", r.choices[0].text.length > 0 && text === r.choices[0].text && r.usage.completion_tokens === 12,
    JSON.stringify({ r, text }));
});

const weatherTools = [
  { type: "function", function: { name: "get_weather", parameters: { type: "object",
    properties: { city: { type: "string" }, days: { type: "integer" } } } } },
  { type: "function", function: { name: "get_time", parameters: { type: "object", properties: {} } } },
];
const ask = [{ role: "user", content: "What is the weather in Paris?" }];

await run("tool calls", async () => {
  const r = await tools.chat.completions.create({ model: "x", messages: ask, tools: weatherTools });
  const m = r.choices[0].message;
  const got = m.tool_calls.map((c) => [c.function.name, JSON.parse(c.function.arguments)]);
  const exp = expected.tool_calls.map((c) => [c.name, c.arguments]);
  check("tool calls", JSON.stringify(got) === JSON.stringify(exp) && m.content === expected.content &&
    r.choices[0].finish_reason === "tool_calls", JSON.stringify(r));
});

await run("tool calls streamed (the client's stream helper)", async () => {
  const runner = tools.chat.completions.stream({ model: "x", messages: ask, tools: weatherTools });
  const final = await runner.finalChatCompletion();
  const m = final.choices[0].message;
  const got = m.tool_calls.map((c) => [c.function.name, JSON.parse(c.function.arguments)]);
  const exp = expected.tool_calls.map((c) => [c.name, c.arguments]);
  check("tool calls streamed", JSON.stringify(got) === JSON.stringify(exp) && m.content === expected.content &&
    m.tool_calls.every((c) => c.id.startsWith("call_")), JSON.stringify(final));
});

await run("a round trip", async () => {
  const r = await tools.chat.completions.create({ model: "x", messages: ask, tools: weatherTools });
  const m = r.choices[0].message;
  const next = [...ask, m, ...m.tool_calls.map((c) => ({ role: "tool", tool_call_id: c.id, content: "sunny" }))];
  const r2 = await tools.chat.completions.create({ model: "x", messages: next, tools: weatherTools });
  check("a round trip", r2.choices[0].finish_reason === "tool_calls" &&
    r2.usage.prompt_tokens_details.cached_tokens >= r.usage.prompt_tokens, JSON.stringify(r2.usage));
});

await run("errors", async () => {
  let e400 = null, e404 = null;
  try {
    await plain.chat.completions.create({ model: "x", messages, temperature: -1 });
  } catch (e) {
    e400 = e;
  }
  try {
    await plain.get("/nothing");
  } catch (e) {
    e404 = e;
  }
  check("errors", e400 instanceof OpenAI.BadRequestError && e400.status === 400 && e400.param === "temperature" &&
    e404 instanceof OpenAI.NotFoundError, `${e400} / ${e404}`);
});
