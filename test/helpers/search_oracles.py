"""Independent references of the plug-in's searches, one hypothesis at a time.

Each calls ESPnet's prediction network (``decoder.embed`` + ``rnn_forward``) and
joint network directly and follows the rules of docs/decoding.md written again,
without any search code:

* multi-blank lattices (standard: no big blanks): a label stays at its frame, the
  blank moves 1 frame, big blank i ``durations[i]`` frames (never past T);
  :func:`mb_reference_greedy`, :func:`brute_force_sequences` (every path),
  :func:`mb_reference_beam`;
* TDT: an arc is a token and a duration scored ``log_softmax(z[:V])[k] +
  log_softmax(z[V:])[j]``; from frame t of T a blank takes a duration 1 <= e <= T - t,
  a label e < T - t (e >= 1 once ``max_sym_per_frame`` labels stayed at that frame);
  where nothing is allowed (duration sets without 1) the blank takes any duration,
  clipped at T. ``blank_decision`` "symbol" emits the most probable arc; "total" the
  token whose allowed arcs are the most probable together, with its most probable
  duration, scoring that total. :func:`tdt_reference_greedy`,
  :func:`enumerate_paths`, :func:`tdt_reference_beam`.

The models are ``SimpleNamespace`` s with ``decoder``, ``joint_network``,
``blank_id`` and ``big_blank_durations`` (multi-blank) or ``tdt_durations`` (TDT), as
:mod:`search_cases` builds them.
"""

import math

import torch


def _predict(dec):
    """One prediction-network step of ``dec``: (label, state) -> (output, state)."""

    def pred(k, state):
        out, state = dec.rnn_forward(dec.embed(torch.tensor([[k]])), state)
        return out[0, 0], state

    return pred


def _blank_frames(model):
    """{blank symbol: frames it moves} of a multi-blank model."""
    frames = {model.blank_id: 1}
    frames.update(
        {model.blank_id - 1 - i: d for i, d in enumerate(model.big_blank_durations)}
    )
    return frames


def _merge(queue, hyp):
    """Queue ``hyp`` (a dict with "y", its labels, and "s", its score) at its label
    sequence: a sequence already there keeps the better hypothesis with the log-add
    of both scores."""
    old = queue.get(hyp["y"])
    if old is None:
        queue[hyp["y"]] = hyp
        return
    total = float(torch.logaddexp(torch.tensor(old["s"]), torch.tensor(hyp["s"])))
    if hyp["s"] > old["s"]:
        queue[hyp["y"]] = hyp
    queue[hyp["y"]]["s"] = total


def mb_greedy_path(model, enc, blank_decision, max_sym, lm=None):
    """Greedy search of docs/decoding.md written again for one utterance, with the
    decoder and joint network called directly. Returns (labels, score, frames skipped,
    big blanks).

    ``lm(labels) -> ({label: weighted LM score of it next}, weighted end score)``:
    shallow fusion, every label's log-probability plus its LM score, the end score
    added once at the end."""
    blank, dec, joint = model.blank_id, model.decoder, model.joint_network
    frames, pred = _blank_frames(model), _predict(dec)
    T, V = enc.size(0), dec.odim

    out, state = pred(blank, dec.init_state(1))
    t, n, labels, score, big, skipped = 0, 0, [], 0.0, 0, 0
    with torch.no_grad():
        while t < T:
            logp = torch.log_softmax(joint(enc[t], out), -1).double().tolist()
            if lm is not None:
                bonus, _ = lm(labels)
                logp = [v + bonus.get(k, 0.0) for k, v in enumerate(logp)]
            blanks = [k for k, f in frames.items() if t + f <= T]
            allowed = blanks + (
                [k for k in range(V) if k not in frames] * (n < max_sym)
            )
            k = max(allowed, key=lambda k: logp[k])
            step = logp[k]
            if blank_decision == "total":
                total = math.log(sum(math.exp(logp[b]) for b in blanks))
                if k not in frames and logp[k] <= total:
                    k = max(blanks, key=lambda b: logp[b])
                if k in frames:
                    step = total
            score += step
            if k in frames:
                t, n, big = t + frames[k], 0, big + (frames[k] > 1)
                skipped += frames[k] - 1
            else:
                labels.append(k)
                n += 1
                out, state = pred(k, state)
    if lm is not None:
        score += lm(labels)[1]
    return labels, score, skipped, big


def mb_reference_greedy(model, enc, blank_decision, max_sym, lm=None):
    """:func:`mb_greedy_path` without the frames skipped: (labels, score, big
    blanks)."""
    labels, score, _, big = mb_greedy_path(model, enc, blank_decision, max_sym, lm)
    return labels, score, big


def brute_force_sequences(model, enc, max_sym):
    """log P(y | x) for every label sequence y, by enumerating every path.

    Independent of the searches: ESPnet's decoder and joint network called directly,
    one path at a time, with the lattice rules of ``docs/lattice.md`` (labels stay,
    blank +1, big blank i + d_i, no overshoot) and at most ``max_sym`` labels per frame.
    """
    blank, durations = model.blank_id, model.big_blank_durations
    dec, joint = model.decoder, model.joint_network
    labels = [k for k in range(dec.odim) if k > blank or k < blank - len(durations)]
    T = enc.size(0)
    paths = {}
    step = _predict(dec)

    def rec(t, y, n_sym, dec_out, state, lp):
        if t == T:
            paths.setdefault(y, []).append(lp)
            return
        logp = torch.log_softmax(joint(enc[t], dec_out), dim=-1).double()
        rec(t + 1, y, 0, dec_out, state, lp + logp[blank])
        for i, d in enumerate(durations):
            if t + d <= T:
                rec(t + d, y, 0, dec_out, state, lp + logp[blank - 1 - i])
        if n_sym < max_sym:
            for k in labels:
                out, new_state = step(k, state)
                rec(t, y + (k,), n_sym + 1, out, new_state, lp + logp[k])

    with torch.no_grad():
        out, state = step(blank, dec.init_state(1))
        rec(0, (), 0, out, state, torch.tensor(0.0, dtype=torch.float64))
    return {y: float(torch.logsumexp(torch.stack(v), 0)) for y, v in paths.items()}


def mb_reference_beam(model, enc, beam, max_sym, blank_decision):
    """The beam search of docs/decoding.md, written again one hypothesis at a time
    with the decoder and joint network called directly (no search code).

    Returns:
        [(labels, score, big_blank_emissions, frames_skipped)] of every complete
        hypothesis, and the number of hypotheses of every expansion, in order.
    """
    blank, dec, joint = model.blank_id, model.decoder, model.joint_network
    frames, pred = _blank_frames(model), _predict(dec)
    T, V = enc.size(0), dec.odim

    queues = [dict() for _ in range(T + 1)]
    out, state = pred(blank, dec.init_state(1))
    queues[0][()] = dict(y=(), s=0.0, out=out, st=state, n=0, big=0, skip=0)
    expansions = []
    with torch.no_grad():
        for t in range(T):
            current = sorted(queues[t].values(), key=lambda h: -h["s"])[:beam]
            while current:
                expansions.append(len(current))
                cands = []
                for a, h in enumerate(current):
                    logp = torch.log_softmax(joint(enc[t], h["out"]), -1).double()
                    blanks = []
                    for k in range(V):
                        f = frames.get(k, 0)
                        if (f == 0 and h["n"] >= max_sym) or t + f > T:
                            continue
                        if f and blank_decision == "total":
                            blanks.append(k)
                        else:
                            cands.append((h["s"] + float(logp[k]), a, k))
                    if blanks:  # one candidate: the blanks' total, the best blank
                        total = float(torch.logsumexp(logp[blanks], 0))
                        best = max(blanks, key=lambda b: float(logp[b]))
                        cands.append((h["s"] + total, a, best))
                cands = sorted(cands, key=lambda c: -c[0])[:beam]
                ahead = sorted((h["s"] for h in queues[t + 1].values()), reverse=True)
                floor = ahead[beam - 1] if len(ahead) >= beam else float("-inf")
                nxt = []
                for s, a, k in cands:
                    h, f = current[a], frames.get(k, 0)
                    if f == 0:
                        if s >= floor:
                            out, state = pred(k, h["st"])
                            nxt.append(dict(h, y=h["y"] + (k,), s=s, out=out, st=state))
                            nxt[-1]["n"] = h["n"] + 1
                        continue
                    child = dict(h, s=s, n=0)
                    child["big"] += f > 1
                    child["skip"] += f - 1
                    _merge(queues[t + f], child)
                current = nxt
    final = [(h["y"], h["s"], h["big"], h["skip"]) for h in queues[T].values()]
    return final, expansions


class TDTOracle:
    """The networks called directly: prediction-network steps and arc log-probs."""

    def __init__(self, model):
        self.dec, self.joint = model.decoder, model.joint_network
        self.V = model.decoder.odim
        self.blank = model.blank_id
        self.durations = model.tdt_durations
        self.pred = _predict(self.dec)

    def start(self):
        return self.pred(self.blank, self.dec.init_state(1))

    def allowed(self, k, e, n_stayed, max_sym, room):
        if k == self.blank:
            return 1 <= e <= room
        return e < room and (e >= 1 or n_stayed < max_sym)

    def arcs(
        self, enc_t, dec_out, n_stayed, max_sym, room, decision="symbol", bonus=None
    ):
        """{(k, j): score} of every allowed arc ("symbol": its log-prob) or of the
        best arc of every token ("total": the token's allowed arcs' total); ``bonus``
        ({label: weighted LM score}) is added to the labels' token log-probs."""
        z = self.joint(enc_t, dec_out).double()
        tok, dur = z[: self.V].log_softmax(-1), z[self.V :].log_softmax(-1)
        if bonus:
            tok = tok + torch.tensor(
                [bonus.get(k, 0.0) for k in range(self.V)], dtype=torch.float64
            )
        ok = {
            (k, j)
            for k in range(self.V)
            for j, e in enumerate(self.durations)
            if self.allowed(k, e, n_stayed, max_sym, room)
        }
        if not ok:  # nothing fits: any blank, clipped
            ok = {(self.blank, j) for j, e in enumerate(self.durations) if e >= 1}
        if decision == "symbol":
            return {(k, j): float(tok[k] + dur[j]) for k, j in ok}
        out = {}
        for k in range(self.V):
            slots = [j for j in range(len(self.durations)) if (k, j) in ok]
            if slots:
                best = max(slots, key=lambda j: float(dur[j]))
                out[k, best] = float(tok[k] + torch.logsumexp(dur[slots], 0))
        return out


def tdt_reference_greedy(model, enc, max_sym, decision="total", lm=None):
    """The best candidate (``TDTOracle.arcs``) at every step, by enumerating them all.

    ``lm(labels) -> ({label: weighted LM score of it next}, weighted end score)``:
    shallow fusion (the labels' token log-probs plus their LM score, the end score
    added once at the end)."""
    o = TDTOracle(model)
    T = enc.size(0)
    t, n, y, score, skipped, long_blanks = 0, 0, [], 0.0, 0, 0
    with torch.no_grad():
        out, state = o.start()
        while t < T:
            bonus = None if lm is None else lm(y)[0]
            arcs = o.arcs(enc[t], out, n, max_sym, T - t, decision, bonus)
            (k, j), lp = max(arcs.items(), key=lambda a: a[1])
            score += lp
            frames = min(o.durations[j], T - t)
            if k != o.blank:
                y.append(k)
                out, state = o.pred(k, state)
            if frames == 0:
                n += 1
                continue
            t, n = t + frames, 0
            skipped += frames - 1
            long_blanks += int(frames > 1 and k == o.blank)
    if lm is not None:
        score += lm(y)[1]
    return y, score, skipped, long_blanks


def enumerate_paths(model, enc, max_sym):
    """log P(y) summed over every path of the search lattice, per label sequence."""
    o = TDTOracle(model)
    T = enc.size(0)
    paths = {}

    def rec(t, y, n, out, state, lp):
        if t == T:
            paths.setdefault(y, []).append(lp)
            return
        for (k, j), a in o.arcs(enc[t], out, n, max_sym, T - t).items():
            frames = min(o.durations[j], T - t)
            new_t, new_n = (t, n + 1) if frames == 0 else (t + frames, 0)
            if k == o.blank:
                rec(new_t, y, new_n, out, state, lp + a)
            else:
                new_out, new_state = o.pred(k, state)
                rec(new_t, y + (k,), new_n, new_out, new_state, lp + a)

    with torch.no_grad():
        out, state = o.start()
        rec(0, (), 0, out, state, 0.0)
    return {
        y: float(torch.logsumexp(torch.tensor(v, dtype=torch.float64), 0))
        for y, v in paths.items()
    }


def tdt_reference_beam(model, enc, beam, max_sym, decision="symbol"):
    """The TDT beam search of docs/decoding.md written again, one hypothesis at a
    time (no search code).

    Returns:
        [(labels, score, long blanks, frames skipped)] of every complete hypothesis,
        and the number of hypotheses of every expansion, in order.
    """
    o = TDTOracle(model)
    T = enc.size(0)

    def moved(h, frames, blank):
        h = dict(h, n=0)
        h["skip"] += max(frames - 1, 0)
        h["big"] += int(blank and frames > 1)
        return h

    queues = [dict() for _ in range(T + 1)]
    expansions = []
    with torch.no_grad():
        out, state = o.start()
        queues[0][()] = dict(y=(), s=0.0, out=out, st=state, n=0, big=0, skip=0)
        for t in range(T):
            current = sorted(queues[t].values(), key=lambda h: -h["s"])[:beam]
            while current:
                expansions.append(len(current))
                cands = []
                for a, h in enumerate(current):
                    arcs = o.arcs(enc[t], h["out"], h["n"], max_sym, T - t, decision)
                    for (k, j), lp in arcs.items():
                        cands.append((h["s"] + lp, a, k, j))
                cands = sorted(cands, key=lambda c: -c[0])[:beam]
                ahead = sorted((h["s"] for h in queues[t + 1].values()), reverse=True)
                floor = ahead[beam - 1] if len(ahead) >= beam else float("-inf")
                nxt = []
                for s, a, k, j in cands:
                    h = current[a]
                    frames = min(o.durations[j], T - t)
                    if k == o.blank:
                        _merge(queues[t + frames], moved(dict(h, s=s), frames, True))
                        continue
                    if frames == 0 and s < floor:
                        continue
                    out, state = o.pred(k, h["st"])
                    child = dict(h, y=h["y"] + (k,), s=s, out=out, st=state)
                    if frames == 0:
                        child["n"] = h["n"] + 1
                        nxt.append(child)
                    else:
                        _merge(queues[t + frames], moved(child, frames, False))
                current = nxt
    final = [(h["y"], h["s"], h["big"], h["skip"]) for h in queues[T].values()]
    return final, expansions
