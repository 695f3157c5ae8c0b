// AudioWorklet: the microphone's first channel, posted to the page in blocks of
// about 20 ms. When the AudioContext could not run at the model's rate, it also
// resamples, with a windowed-sinc low-pass interpolator (Chromium runs the context
// at the model's rate and does not need it; ?resample=page tries it there).
class Recorder extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const o = options.processorOptions || {};
    const inRate = o.inRate || sampleRate;
    const outRate = o.outRate || sampleRate;
    this.block = Math.max(128, Math.round(outRate / 50));
    this.out = new Float32Array(this.block);
    this.filled = 0;
    this.step = inRate / outRate; // input samples per output sample
    if (this.step !== 1) {
      // cut-off below the lower Nyquist frequency, in cycles per input sample
      this.fc = 0.5 * Math.min(1, 1 / this.step) * 0.95;
      this.half = Math.ceil(8 * Math.max(1, this.step)); // taps on each side
      this.buf = new Float32Array(0); // input samples base, base + 1, ...
      this.base = 0;
      this.pos = 0; // the next output sample's position in input samples
    }
  }

  push(v) {
    this.out[this.filled++] = v;
    if (this.filled === this.block) {
      this.port.postMessage(this.out);
      this.out = new Float32Array(this.block);
      this.filled = 0;
    }
  }

  kernel(t) {
    const x = 2 * this.fc * t;
    const sinc = x === 0 ? 1 : Math.sin(Math.PI * x) / (Math.PI * x);
    const hann = 0.5 + 0.5 * Math.cos((Math.PI * t) / (this.half + 1));
    return 2 * this.fc * sinc * hann;
  }

  process(inputs) {
    const x = inputs[0] && inputs[0][0];
    if (!x) return true;
    if (this.step === 1) {
      for (let i = 0; i < x.length; i++) this.push(x[i]);
      return true;
    }
    const buf = new Float32Array(this.buf.length + x.length);
    buf.set(this.buf);
    buf.set(x, this.buf.length);
    this.buf = buf;
    const end = this.base + buf.length;
    // an output sample needs the inputs up to `half` after its position
    while (Math.floor(this.pos) + this.half < end) {
      const c = Math.floor(this.pos);
      let acc = 0;
      for (let k = Math.max(c - this.half + 1, this.base); k <= c + this.half; k++) {
        acc += buf[k - this.base] * this.kernel(this.pos - k);
      }
      this.push(acc);
      this.pos += this.step;
    }
    const keep = Math.floor(this.pos) - this.half + 1; // the first input still needed
    if (keep > this.base) {
      this.buf = this.buf.slice(keep - this.base);
      this.base = keep;
    }
    return true;
  }
}

registerProcessor("recorder", Recorder);
