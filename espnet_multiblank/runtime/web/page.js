// The live page: the microphone at the model's sample rate, sent to /ws in pieces;
// the server's results shown as they come (protocol: docs/deploy.md, "A live page").
//
// URL options: ?seconds=S sends exactly S seconds of audio, then "Done" (a recording
// of known length, for tests and demos); ?piece_ms=M pieces of M ms (default 100);
// ?resample=page resamples in the page (what a browser gets whose AudioContext cannot
// run at the model's rate).
"use strict";

const params = new URLSearchParams(location.search);
const el = (id) => document.getElementById(id);

// What the page did and received (read by the browser test)
const live = (window.live = {
  state: "idle",
  info: null,
  messages: [],
  finals: [], // the final text of each segment
  samplesSent: 0,
  error: null,
});

let info = null;
let socket = null;
let audio = null; // {context, stream, node}
let pending = []; // Float32Array blocks not yet sent
let pendingSamples = 0;
let limit = Infinity; // samples to send (?seconds)
let pieceSamples = 0;
let segments = []; // per segment its last message

function setState(state, text) {
  live.state = state;
  document.body.dataset.state = state;
  el("status").textContent = text || state;
  el("start").disabled = !(state === "idle" || state === "done" || state === "error");
  el("stop").disabled = state !== "recording";
}

function fail(text) {
  live.error = text;
  setState("error", text);
  stopAudio();
}

async function loadInfo() {
  const response = await fetch("info");
  info = live.info = await response.json();
  const kinds = {
    standard: "standard RNN-T",
    multiblank: `multi-blank (big blanks of ${info.big_blank_durations.join(", ")} frames)`,
    tdt: `TDT (durations ${info.tdt_durations.join(", ")})`,
  };
  const chunkSeconds = (info.chunk_size * info.frame_shift).toFixed(2);
  el("model").textContent =
    `${kinds[info.lattice] || info.lattice} · ${info.sample_rate} Hz · ` +
    `${info.search} search · chunks of ${info.chunk_size} frames (${chunkSeconds} s), ` +
    `a frame every ${Math.round(info.frame_shift * 1000)} ms`;
  setState("idle", "idle: press Start and speak");
}

// ------------------------------------------------------------------ audio
async function startAudio() {
  const stream = await navigator.mediaDevices.getUserMedia({
    audio: {
      channelCount: 1,
      echoCancellation: false,
      noiseSuppression: false,
      autoGainControl: false,
    },
  });
  let context;
  let options = {};
  try {
    // the browser resamples the microphone to the model's rate (?resample=page
    // tries the page's resampler instead)
    if (params.get("resample") === "page") throw new Error("?resample=page");
    context = new AudioContext({ sampleRate: info.sample_rate });
    context.createMediaStreamSource(stream).disconnect();
  } catch (e) {
    // a browser that cannot: the worklet resamples (a simple filter)
    if (context) context.close();
    context = new AudioContext();
    options = { inRate: context.sampleRate, outRate: info.sample_rate };
    console.warn(`resampling ${context.sampleRate} Hz in the page: ${e}`);
  }
  await context.audioWorklet.addModule("recorder.js");
  const source = context.createMediaStreamSource(stream);
  const node = new AudioWorkletNode(context, "recorder", { processorOptions: options });
  node.port.onmessage = (event) => onSamples(event.data);
  source.connect(node);
  await context.resume();
  audio = { context, stream, node, source };
}

function stopAudio() {
  if (!audio) return;
  audio.source.disconnect();
  audio.node.port.onmessage = null;
  audio.stream.getTracks().forEach((t) => t.stop());
  audio.context.close();
  audio = null;
}

function onSamples(block) {
  if (live.state !== "recording") return;
  const room = limit - live.samplesSent - pendingSamples;
  if (block.length > room) block = block.subarray(0, Math.max(room, 0));
  if (block.length) {
    pending.push(block);
    pendingSamples += block.length;
  }
  const full = live.samplesSent + pendingSamples >= limit;
  if (pendingSamples >= pieceSamples || full) sendPending();
  if (full) stop();
}

function sendPending() {
  if (!pendingSamples || !socket || socket.readyState !== WebSocket.OPEN) return;
  const piece = new Float32Array(pendingSamples);
  let at = 0;
  for (const block of pending) {
    piece.set(block, at);
    at += block.length;
  }
  // Float32Array is little-endian on every platform browsers run on
  socket.send(piece.buffer);
  live.samplesSent += piece.length;
  pending = [];
  pendingSamples = 0;
}

// --------------------------------------------------------------- session
async function start() {
  live.messages = [];
  live.finals = [];
  live.samplesSent = 0;
  live.error = null;
  segments = [];
  pending = [];
  pendingSamples = 0;
  render();
  const seconds = parseFloat(params.get("seconds"));
  limit = seconds > 0 ? Math.round(seconds * info.sample_rate) : Infinity;
  pieceSamples = Math.round(((parseFloat(params.get("piece_ms")) || 100) / 1000) * info.sample_rate);
  setState("starting", "starting the microphone");
  try {
    await startAudio();
  } catch (e) {
    fail(`no microphone: ${e}`);
    return;
  }
  const url = new URL("ws", location.href);
  url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
  socket = new WebSocket(url);
  socket.binaryType = "arraybuffer";
  socket.onopen = () => {
    socket.send(JSON.stringify({ sample_rate: info.sample_rate }));
    setState("recording", "recording: speak");
  };
  socket.onmessage = (event) => onMessage(JSON.parse(event.data));
  socket.onclose = (event) => {
    stopAudio();
    if (live.state === "error") return;
    if (live.state === "finishing" && event.code === 1000) {
      setState("done", `done: ${(live.samplesSent / info.sample_rate).toFixed(2)} s sent`);
    } else {
      fail(`the connection closed (${event.code} ${event.reason || ""})`);
    }
  };
}

function stop() {
  if (live.state !== "recording") return;
  sendPending();
  stopAudio();
  setState("finishing", "finishing: waiting for the final result");
  socket.send("Done");
}

function onMessage(message) {
  live.messages.push(message);
  if (message.error) {
    fail(`server: ${message.error}`);
    return;
  }
  segments[message.segment] = message;
  if (message.is_final) live.finals[message.segment] = message.text;
  render();
}

// ---------------------------------------------------------------- display
function words(message) {
  // tokens -> words with the time of their first token
  const out = [];
  message.tokens.forEach((token, i) => {
    const time = message.timestamps[i];
    if (info.token_type === "bpe") {
      if (token.startsWith("\u2581") || !out.length) out.push({ word: token.replace(/^\u2581/, ""), time });
      else out[out.length - 1].word += token;
    } else if (info.token_type === "char") {
      if (token === "<space>") out.push(null);
      else if (!out.length || out[out.length - 1] === null) out.push({ word: token, time });
      else out[out.length - 1].word += token;
    } else {
      out.push({ word: token, time });
    }
  });
  return out.filter((w) => w && w.word);
}

function render() {
  const finals = segments.filter((m) => m && m.is_final).map((m) => m.text.trim()).filter((t) => t);
  el("finals").textContent = finals.join(" ");
  const last = segments[segments.length - 1];
  el("partial").textContent = last && !last.is_final ? last.text : "";
  const box = el("words");
  box.textContent = "";
  let offset = 0; // seconds before the segment
  segments.forEach((m) => {
    if (!m) return;
    for (const w of words(m)) {
      const chip = document.createElement("span");
      chip.className = m.is_final ? "word" : "word partial";
      chip.textContent = w.word;
      const time = document.createElement("small");
      time.textContent = `${(offset + w.time).toFixed(2)} s`;
      chip.appendChild(time);
      box.appendChild(chip);
    }
    offset += m.samples / info.sample_rate;
  });
  drawStrip(last);
}

function drawStrip(message) {
  const canvas = el("strip");
  const ctx = canvas.getContext("2d");
  const frames = message ? message.num_frames : 0;
  // pixels per encoder frame: the box's width while the frames fit, then scrolling
  const width = el("strip-box").clientWidth - 10;
  const CELL = Math.max(5, Math.min(16, Math.floor(width / Math.max(frames, 1))));
  canvas.width = Math.max(width, frames * CELL);
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  if (!message) {
    el("counts").textContent = "";
    return;
  }
  const kind = new Array(frames).fill("evaluated");
  for (let f = message.decided; f < frames; f++) kind[f] = "waiting";
  for (const [t, d] of message.skips) {
    for (let f = t + 1; f < t + d && f < frames; f++) kind[f] = "skipped";
  }
  for (const time of message.timestamps) {
    const f = Math.round(time / info.frame_shift);
    if (f < frames) kind[f] = "label";
  }
  const colors = { label: "#2563eb", evaluated: "#cbd2d9", skipped: "#f59e0b", waiting: "#ffffff" };
  kind.forEach((k, f) => {
    ctx.fillStyle = colors[k];
    ctx.fillRect(f * CELL, 4, CELL - 1, 20);
    if (k === "waiting") {
      ctx.strokeStyle = "#9aa5b1";
      ctx.strokeRect(f * CELL + 0.5, 4.5, CELL - 2, 19);
    }
  });
  // each jump as a bracket under the frames it covers
  ctx.strokeStyle = "#b45309";
  for (const [t, d] of message.skips) {
    ctx.beginPath();
    ctx.moveTo(t * CELL + CELL / 2, 26);
    ctx.lineTo(t * CELL + CELL / 2, 31);
    ctx.lineTo((t + d) * CELL - 1, 31);
    ctx.lineTo((t + d) * CELL - 1, 26);
    ctx.stroke();
  }
  const share = message.decided ? Math.round((100 * message.frames_skipped) / message.decided) : 0;
  el("counts").textContent =
    `segment ${message.segment}: ${frames} frames, ${message.decided} decided, ` +
    `${message.frames_skipped} skipped (${share}%)${message.is_final ? ", final" : ""}`;
  el("strip-box").scrollLeft = canvas.width;
}

el("start").onclick = start;
el("stop").onclick = stop;
loadInfo().catch((e) => fail(`cannot read the model's description: ${e}`));
