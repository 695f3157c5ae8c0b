// AudioWorklet: the microphone's first channel, posted to the page in blocks of
// about 20 ms. When the AudioContext could not run at the model's rate, it also
// resamples (linear interpolation after a moving-average low-pass; the page says
// so): Chromium runs the context at the model's rate and does not need it.
class Recorder extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const o = options.processorOptions || {};
    this.ratio = (o.inRate || sampleRate) / (o.outRate || sampleRate);
    this.block = Math.max(128, Math.round((o.outRate || sampleRate) / 50));
    this.buffer = new Float32Array(this.block);
    this.filled = 0;
    this.pos = 0; // next output sample's position in input samples
    this.prev = 0; // the last (filtered) input sample of the previous call
    this.taps = Math.max(1, Math.floor(this.ratio));
    this.history = new Float32Array(this.taps);
    this.hpos = 0;
    this.hsum = 0;
  }

  push(v) {
    this.buffer[this.filled++] = v;
    if (this.filled === this.block) {
      this.port.postMessage(this.buffer);
      this.buffer = new Float32Array(this.block);
      this.filled = 0;
    }
  }

  process(inputs) {
    const x = inputs[0] && inputs[0][0];
    if (!x) return true;
    if (this.ratio === 1) {
      for (let i = 0; i < x.length; i++) this.push(x[i]);
      return true;
    }
    // moving average over `taps` samples against aliasing, then interpolation
    const y = new Float32Array(x.length);
    for (let i = 0; i < x.length; i++) {
      this.hsum += x[i] - this.history[this.hpos];
      this.history[this.hpos] = x[i];
      this.hpos = (this.hpos + 1) % this.taps;
      y[i] = this.hsum / this.taps;
    }
    while (this.pos < x.length - 1) {
      const i = Math.floor(this.pos);
      const f = this.pos - i;
      const a = i < 0 ? this.prev : y[i];
      this.push(a + f * (y[i + 1] - a));
      this.pos += this.ratio;
    }
    this.pos -= x.length;
    this.prev = y[x.length - 1];
    return true;
  }
}

registerProcessor("recorder", Recorder);
