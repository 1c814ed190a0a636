// Tool calls and thinking through the official openai client, on the scripted checkpoint
// (make_scripted_model.py: after a chat prompt it always thinks, answers, then calls get_weather):
// reasoning_content, content and tool_calls come out as the model wrote them, plain and streamed, the
// tool call also after the thinking block; a tool round trip renders; the reply equals `gemma4c run`'s.
//   node client_scripted.mjs BASE_URL MODEL_DIR RUN_OUTPUT_DIR
import fs from 'node:fs';
import OpenAI from 'openai';
import { check, done, step } from './util.mjs';

const [base, dir, runDir] = process.argv.slice(2);
const script = JSON.parse(fs.readFileSync(`${dir}/script.json`, 'utf8'));
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'none', maxRetries: 0, timeout: 120000 });
const model = 'scripted';
const tools = [{
  type: 'function',
  function: { name: 'get_weather', description: 'The forecast', parameters: { type: 'object', properties: { days: { type: 'array' } } } },
}];
const messages = [{ role: 'user', content: 'What is the weather?' }];
const wantArgs = JSON.stringify({ days: [3] });
const wantName = script.tool_call.slice('call:'.length, script.tool_call.indexOf('{'));

function checkCall(calls, what) {
  check(Array.isArray(calls) && calls.length === 1 && calls[0].type === 'function' && calls[0].id.startsWith('call_') &&
    calls[0].function.name === wantName && JSON.stringify(JSON.parse(calls[0].function.arguments)) === wantArgs,
  `${what}: tool_calls holds ${wantName}(${wantArgs}) (${JSON.stringify(calls)})`);
}

for (const think of [true, false]) {
  const extra = think ? { reasoning_effort: 'high' } : {};
  const label = think ? 'thinking' : 'no thinking';
  await step(label, async () => {
    const r = await client.chat.completions.create({ model, messages, tools, temperature: 0, ...extra });
    const m = r.choices[0].message;
    check(think ? m.reasoning_content === script.thinking : m.reasoning_content === undefined,
      `${label}: reasoning_content ${JSON.stringify(m.reasoning_content)}`);
    check(m.content === script.answer, `${label}: content is the answer alone (${JSON.stringify(m.content)})`);
    checkCall(m.tool_calls, label);
    check(r.choices[0].finish_reason === 'tool_calls', `${label}: finish_reason tool_calls`);
    if (think) {
      const run = fs.readFileSync(`${runDir}/answer.txt`, 'utf8').trimEnd().split('\n');
      const calls = JSON.parse(run.pop()).tool_calls;
      check(run.join('\n') === m.content && fs.readFileSync(`${runDir}/thinking.txt`, 'utf8').trim() === m.reasoning_content &&
        calls.length === 1 && calls[0].name === m.tool_calls[0].function.name &&
        JSON.stringify(calls[0].arguments) === m.tool_calls[0].function.arguments, 'the reply is what `gemma4c run --think` prints');
    }

    const stream = await client.chat.completions.create({ model, messages, tools, temperature: 0, stream: true, ...extra });
    let reasoning = '', content = '', order = '', finish = null;
    const calls = [];
    for await (const c of stream) {
      const ch = c.choices[0];
      if (!ch) continue;
      const d = ch.delta;
      if (d.reasoning_content) reasoning += d.reasoning_content, order += order.endsWith('r') ? '' : 'r';
      if (d.content) content += d.content, order += order.endsWith('c') ? '' : 'c';
      for (const t of d.tool_calls ?? []) {
        order += 't';
        if (!calls[t.index]) calls[t.index] = { id: t.id, type: t.type, function: { name: '', arguments: '' } };
        calls[t.index].function.name += t.function?.name ?? '';
        calls[t.index].function.arguments += t.function?.arguments ?? '';
      }
      if (ch.finish_reason) finish = ch.finish_reason;
    }
    check(reasoning === (think ? script.thinking : '') && content === script.answer,
      `${label}, streamed: reasoning_content and content deltas (${JSON.stringify(reasoning)}, ${JSON.stringify(content)})`);
    check(order === (think ? 'rct' : 'ct'), `${label}, streamed: thinking, then the answer, then the tool call (${order})`);
    checkCall(calls, `${label}, streamed`);
    check(finish === 'tool_calls', `${label}, streamed: finish_reason tool_calls`);
  });
}

await step('tool round trip', async () => {
  const first = await client.chat.completions.create({ model, messages, tools, temperature: 0 });
  const call = first.choices[0].message.tool_calls[0];
  const r = await client.chat.completions.create({
    model, tools, temperature: 0, max_tokens: 4,
    messages: [...messages, { role: 'assistant', content: null, tool_calls: [call] },
      { role: 'tool', tool_call_id: call.id, content: JSON.stringify({ forecast: 'rain' }) }],
  });
  check(r.choices.length === 1 && r.usage.prompt_tokens > first.usage.prompt_tokens,
    'a tool result goes back to the model (role "tool" after the assistant\'s tool_calls)');
  // the thinking that led to the call goes back with it: the 31B template writes it within the tool-calling turn
  const thought = await client.chat.completions.create({
    model, tools, temperature: 0, max_tokens: 4,
    messages: [...messages, { role: 'assistant', content: null, reasoning_content: 'Rain is likely.', tool_calls: [call] },
      { role: 'tool', tool_call_id: call.id, content: JSON.stringify({ forecast: 'rain' }) }],
  });
  check(thought.usage.prompt_tokens > r.usage.prompt_tokens,
    `an assistant message's reasoning_content reaches the template (${thought.usage.prompt_tokens} > ${r.usage.prompt_tokens} prompt tokens)`);
  // a tool message that names its function instead of answering a call id
  const named = await client.chat.completions.create({
    model, tools, temperature: 0, max_tokens: 4,
    messages: [...messages, { role: 'assistant', content: null, tool_calls: [call] },
      { role: 'tool', name: 'get_weather', content: JSON.stringify({ forecast: 'rain' }) }],
  });
  check(named.usage.prompt_tokens === r.usage.prompt_tokens, 'a tool message with a name and no tool_call_id renders as the call\'s');
  try {
    await client.chat.completions.create({
      model, messages: [...messages, { role: 'assistant', tool_calls: [{ ...call, function: { name: 'get_weather', arguments: '{not json' } }] }],
    });
    check(false, 'tool_calls arguments that are not JSON: no error');
  } catch (e) {
    check(e.status === 400 && e.param === 'messages.tool_calls', `tool_calls arguments that are not JSON: 400 (${e.message})`);
  }
});

await step('no tools offered', async () => {
  // the model always calls get_weather; without tools, or with tool_choice "none", it cannot (OpenAI: "the model will
  // not call any tool and instead generates a message")
  for (const [what, extra] of [['no tools', {}], ['tool_choice none', { tools, tool_choice: 'none' }]]) {
    const r = await client.chat.completions.create({ model, messages, temperature: 0, max_tokens: 8, ...extra });
    const ch = r.choices[0];
    check(ch.message.tool_calls === undefined && ch.finish_reason !== 'tool_calls' && !ch.message.content.includes('tool_call'),
      `${what}: no tool call (${ch.finish_reason} ${JSON.stringify(ch.message)})`);
    const stream = await client.chat.completions.create({ model, messages, temperature: 0, max_tokens: 8, stream: true, ...extra });
    let calls = 0, finish = null;
    for await (const c of stream) {
      calls += (c.choices[0]?.delta.tool_calls ?? []).length;
      finish = c.choices[0]?.finish_reason ?? finish;
    }
    check(calls === 0 && finish !== 'tool_calls', `${what}, streamed: no tool call (${finish})`);
  }
});

done();
