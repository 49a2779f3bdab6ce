"""Operators: rnn family (RNN, GRU, LSTM).

All three share one driver: inputs are brought to the layout-0 shapes, each direction runs a
Python loop over time whose body is vectorised over the batch, and sequence_lens is honoured by
masking (reverse directions first reverse each batch entry's valid prefix in time).
"""

import numpy as np

from opwarden.contract import Contract, one_of, such_that
from opwarden.errors import KernelError
from opwarden.ops.base import op
from opwarden.ops.common import work_float

# Activation functions: name (lower case) -> (f(x, alpha, beta), default alpha, default beta).
# A default of None means the function takes no such parameter.
_ACTIVATIONS = {
    "relu": (lambda x, a, b: np.maximum(x, 0), None, None),
    "tanh": (lambda x, a, b: np.tanh(x), None, None),
    "sigmoid": (lambda x, a, b: 1 / (1 + np.exp(-x)), None, None),
    "affine": (lambda x, a, b: a * x + b, 1.0, 0.0),
    "leakyrelu": (lambda x, a, b: np.where(x >= 0, x, a * x), 0.01, None),
    "thresholdedrelu": (lambda x, a, b: np.where(x >= a, x, 0), 1.0, None),
    "scaledtanh": (lambda x, a, b: a * np.tanh(b * x), 1.0, 1.0),
    "hardsigmoid": (lambda x, a, b: np.clip(a * x + b, 0, 1), 0.2, 0.5),
    "elu": (lambda x, a, b: np.where(x >= 0, x, a * np.expm1(np.minimum(x, 0))), 1.0, None),
    "softsign": (lambda x, a, b: x / (1 + np.abs(x)), None, None),
    "softplus": (lambda x, a, b: np.logaddexp(0, x), None, None),
}

_DIRECTIONS = one_of("forward", "reverse", "bidirectional", "foward")
_ACT_NAMES = such_that(
    lambda v: all(str(s).lower() in _ACTIVATIONS for s in v),
    "activation names among " + ", ".join(sorted(_ACTIVATIONS)),
)
_ALLOWED = {"direction": _DIRECTIONS, "activations": _ACT_NAMES}
_ALLOWED_14 = {**_ALLOWED, "layout": one_of(0, 1)}


def _contract(allowed):
    # Saturating activations can still produce NaN only from NaN inputs; Softplus/Elu of inf
    # stay finite or inf, so NaN propagates rather than being produced.
    return Contract(nan="propagate", allowed=allowed)


def _activation_list(names, alphas, betas, defaults, num_dir):
    """Activation callables per direction; alpha/beta go only to functions that take them."""
    per_dir = len(defaults)
    names = list(names) if names else list(defaults) * num_dir
    if len(names) == per_dir and num_dir == 2:
        names = names * 2
    if len(names) < per_dir * num_dir:
        raise KernelError(
            f"activations: expected {per_dir * num_dir} names, got {len(names)} ({names})"
        )
    alphas = list(alphas or [])
    betas = list(betas or [])
    funcs = []
    for name in names[: per_dir * num_dir]:
        key = str(name).lower()
        if key not in _ACTIVATIONS:
            raise KernelError(f"unknown activation function {name!r}")
        fn, da, db = _ACTIVATIONS[key]
        a = alphas.pop(0) if da is not None and alphas else da
        b = betas.pop(0) if db is not None and betas else db
        funcs.append(lambda x, fn=fn, a=a, b=b: fn(x, a, b))
    return [funcs[d * per_dir : (d + 1) * per_dir] for d in range(num_dir)]


def _clipper(clip):
    if clip is None:
        return lambda x: x
    c = float(clip)
    return lambda x: np.clip(x, -c, c)


def _num_directions(direction):
    if direction not in ("forward", "reverse", "bidirectional", "foward"):
        raise KernelError(f"direction must be forward, reverse or bidirectional, got {direction!r}")
    return 2 if direction == "bidirectional" else 1


def _prepare(X, W, R, layout, gates, hidden_size, num_dir):
    """Checks shapes; returns X as [seq, batch, input] in the work dtype, and H."""
    if X.ndim != 3:
        raise KernelError(f"X must have rank 3, got shape {X.shape}")
    Xw = np.swapaxes(X, 0, 1) if layout == 1 else X
    wd = work_float(X.dtype)
    H = R.shape[-1]
    if hidden_size is not None and int(hidden_size) != H:
        raise KernelError(f"hidden_size={hidden_size} but R has shape {R.shape}")
    if W.shape != (num_dir, gates * H, Xw.shape[2]):
        raise KernelError(
            f"W has shape {W.shape}, expected {(num_dir, gates * H, Xw.shape[2])}"
        )
    if R.shape != (num_dir, gates * H, H):
        raise KernelError(f"R has shape {R.shape}, expected {(num_dir, gates * H, H)}")
    return Xw.astype(wd), H, wd


def _state(S, layout, num_dir, B, H, wd, name):
    """initial_h / initial_c as [num_dir, batch, hidden] (zeros when omitted)."""
    if S is None:
        return np.zeros((num_dir, B, H), wd)
    S = np.swapaxes(S, 0, 1) if layout == 1 else S
    if S.shape != (num_dir, B, H):
        raise KernelError(f"{name} has shape {S.shape}, expected {(num_dir, B, H)} (layout 0)")
    return S.astype(wd)


def _bias(B, num_dir, gates, H, wd):
    """Wb + Rb summed per gate, and Rb alone (GRU's linear_before_reset needs it apart)."""
    if B is None:
        z = np.zeros((num_dir, gates * H), wd)
        return z, z
    if B.shape != (num_dir, 2 * gates * H):
        raise KernelError(f"B has shape {B.shape}, expected {(num_dir, 2 * gates * H)}")
    B = B.astype(wd)
    return B[:, : gates * H], B[:, gates * H :]


def _seq_lens(sequence_lens, T, Bsz):
    if sequence_lens is None:
        return np.full(Bsz, T, np.int64)
    lens = np.asarray(sequence_lens).astype(np.int64).reshape(-1)
    if lens.shape != (Bsz,):
        raise KernelError(f"sequence_lens has shape {sequence_lens.shape}, expected ({Bsz},)")
    if np.any(lens < 0) or np.any(lens > T):
        raise KernelError(f"sequence_lens values must lie in [0, {T}], got {lens.tolist()}")
    return lens


def _reverse_index(lens, T):
    """Time index that reverses each batch entry's valid prefix (an involution)."""
    t = np.arange(T)[:, None]
    return np.where(t < lens[None, :], lens[None, :] - 1 - t, t)


def _run(X, lens, num_dir, direction, step, states):
    """Runs `step` over time for each direction.

    step(d, x_t, states) -> (h_new, new_states) where states is a tuple of [batch, hidden].
    Returns Y [seq, num_dir, batch, hidden] and the final states per direction.
    """
    T, Bsz = X.shape[0], X.shape[1]
    H = states[0].shape[-1]
    Y = np.zeros((T, num_dir, Bsz, H), X.dtype)
    finals = []
    bidx = np.arange(Bsz)
    for d in range(num_dir):
        reverse = direction == "reverse" or d == 1
        ridx = _reverse_index(lens, T) if reverse else None
        Xd = X[ridx, bidx] if reverse else X
        st = tuple(s[d] for s in states)
        Yd = np.zeros((T, Bsz, H), X.dtype)
        for t in range(T):
            active = (t < lens)[:, None]
            h_new, new_st = step(d, Xd[t], st)
            # Entries past their sequence length keep their state and emit zeros.
            st = tuple(np.where(active, n, o) for n, o in zip(new_st, st))
            Yd[t] = np.where(active, h_new, 0)
        Y[:, d] = Yd[ridx, bidx] if reverse else Yd
        finals.append(st)
    return Y, [np.stack(f) for f in zip(*finals)]


def _outputs(Y, finals, layout, dtype):
    """Y and final states in the requested layout and dtype."""
    if layout == 1:
        Y = np.transpose(Y, (2, 0, 1, 3))
        finals = [np.swapaxes(f, 0, 1) for f in finals]
    return (np.ascontiguousarray(Y, dtype=dtype),) + tuple(
        np.ascontiguousarray(f, dtype=dtype) for f in finals
    )


def _rnn(X, W, R, B, sequence_lens, initial_h, *, activation_alpha, activation_beta,
         activations, clip, direction, hidden_size, layout):
    num_dir = _num_directions(direction)
    Xs, H, wd = _prepare(X, W, R, layout, 1, hidden_size, num_dir)
    T, Bsz = Xs.shape[0], Xs.shape[1]
    lens = _seq_lens(sequence_lens, T, Bsz)
    wb, rb = _bias(B, num_dir, 1, H, wd)
    bias = wb + rb
    acts = _activation_list(activations, activation_alpha, activation_beta, ["Tanh"], num_dir)
    cl = _clipper(clip)
    Wt = np.swapaxes(W.astype(wd), 1, 2)
    Rt = np.swapaxes(R.astype(wd), 1, 2)
    h0 = _state(initial_h, layout, num_dir, Bsz, H, wd, "initial_h")

    def step(d, x, st):
        (h,) = st
        h_new = acts[d][0](cl(x @ Wt[d] + h @ Rt[d] + bias[d]))
        return h_new, (h_new,)

    Y, finals = _run(Xs, lens, num_dir, direction, step, (h0,))
    return _outputs(Y, finals, layout, X.dtype)


def _gru(X, W, R, B, sequence_lens, initial_h, *, activation_alpha, activation_beta,
         activations, clip, direction, hidden_size, layout, linear_before_reset):
    num_dir = _num_directions(direction)
    Xs, H, wd = _prepare(X, W, R, layout, 3, hidden_size, num_dir)
    T, Bsz = Xs.shape[0], Xs.shape[1]
    lens = _seq_lens(sequence_lens, T, Bsz)
    wb, rb = _bias(B, num_dir, 3, H, wd)
    acts = _activation_list(
        activations, activation_alpha, activation_beta, ["Sigmoid", "Tanh"], num_dir
    )
    cl = _clipper(clip)
    Wt = np.swapaxes(W.astype(wd), 1, 2)  # [dir, input, 3H], columns z | r | h
    Rt = np.swapaxes(R.astype(wd), 1, 2)  # [dir, H, 3H]
    h0 = _state(initial_h, layout, num_dir, Bsz, H, wd, "initial_h")

    def step(d, x, st):
        (h,) = st
        f, g = acts[d]
        xw = x @ Wt[d] + wb[d]
        hr = h @ Rt[d, :, : 2 * H] + rb[d, : 2 * H]
        z = f(cl(xw[:, :H] + hr[:, :H]))
        r = f(cl(xw[:, H : 2 * H] + hr[:, H:]))
        Rh, Rbh = Rt[d, :, 2 * H :], rb[d, 2 * H :]
        if linear_before_reset:
            cand = xw[:, 2 * H :] + r * (h @ Rh + Rbh)
        else:
            cand = xw[:, 2 * H :] + (r * h) @ Rh + Rbh
        hh = g(cl(cand))
        h_new = (1 - z) * hh + z * h
        return h_new, (h_new,)

    Y, finals = _run(Xs, lens, num_dir, direction, step, (h0,))
    return _outputs(Y, finals, layout, X.dtype)


def _lstm(X, W, R, B, sequence_lens, initial_h, initial_c, P, *, activation_alpha,
          activation_beta, activations, clip, direction, hidden_size, layout, input_forget):
    num_dir = _num_directions(direction)
    Xs, H, wd = _prepare(X, W, R, layout, 4, hidden_size, num_dir)
    T, Bsz = Xs.shape[0], Xs.shape[1]
    lens = _seq_lens(sequence_lens, T, Bsz)
    wb, rb = _bias(B, num_dir, 4, H, wd)
    bias = wb + rb
    acts = _activation_list(
        activations, activation_alpha, activation_beta, ["Sigmoid", "Tanh", "Tanh"], num_dir
    )
    cl = _clipper(clip)
    Wt = np.swapaxes(W.astype(wd), 1, 2)  # columns i | o | f | c
    Rt = np.swapaxes(R.astype(wd), 1, 2)
    if P is None:
        Pw = np.zeros((num_dir, 3 * H), wd)
    elif P.shape != (num_dir, 3 * H):
        raise KernelError(f"P has shape {P.shape}, expected {(num_dir, 3 * H)}")
    else:
        Pw = P.astype(wd)
    h0 = _state(initial_h, layout, num_dir, Bsz, H, wd, "initial_h")
    c0 = _state(initial_c, layout, num_dir, Bsz, H, wd, "initial_c")

    def step(d, x, st):
        h, c = st
        f, g, hf = acts[d]
        pi, po, pf = Pw[d, :H], Pw[d, H : 2 * H], Pw[d, 2 * H :]
        gates = x @ Wt[d] + h @ Rt[d] + bias[d]
        i = f(cl(gates[:, :H] + pi * c))
        if input_forget:
            # Coupled gates: the forget gate is the complement of the input gate.
            fg = 1 - i
        else:
            fg = f(cl(gates[:, 2 * H : 3 * H] + pf * c))
        cc = g(cl(gates[:, 3 * H :]))
        c_new = fg * c + i * cc
        o = f(cl(gates[:, H : 2 * H] + po * c_new))
        h_new = o * hf(c_new)
        return h_new, (h_new, c_new)

    Y, finals = _run(Xs, lens, num_dir, direction, step, (h0, c0))
    return _outputs(Y, finals, layout, X.dtype)


# ---------------------------------------------------------------------------------------------
# RNN


@op("RNN", since=14, contract=_contract(_ALLOWED_14))
def RNN(X, W, R, B=None, sequence_lens=None, initial_h=None, *, activation_alpha=None,
        activation_beta=None, activations=("Tanh", "Tanh"), clip=None, direction="forward",
        hidden_size=None, layout=0):
    """Simple recurrent network, Ht = f(Xt*Wi^T + Ht-1*Ri^T + Wbi + Rbi) (ONNX RNN-14)."""
    return _rnn(X, W, R, B, sequence_lens, initial_h, activation_alpha=activation_alpha,
                activation_beta=activation_beta, activations=activations, clip=clip,
                direction=direction, hidden_size=hidden_size, layout=layout)


@op("RNN", since=7, contract=_contract(_ALLOWED))
def RNN_7(X, W, R, B=None, sequence_lens=None, initial_h=None, *, activation_alpha=None,
          activation_beta=None, activations=("Tanh", "Tanh"), clip=None, direction="forward",
          hidden_size=None):
    """Simple recurrent network, sequence-major layout only (ONNX RNN-7)."""
    return _rnn(X, W, R, B, sequence_lens, initial_h, activation_alpha=activation_alpha,
                activation_beta=activation_beta, activations=activations, clip=clip,
                direction=direction, hidden_size=hidden_size, layout=0)


@op("RNN", since=1, contract=_contract(_ALLOWED))
def RNN_1(X, W, R, B=None, sequence_lens=None, initial_h=None, *, activation_alpha=None,
          activation_beta=None, activations=("Tanh", "Tanh"), clip=None, direction="forward",
          hidden_size=None, output_sequence=0):
    """Simple recurrent network; output_sequence only marks Y optional (ONNX RNN-1)."""
    return RNN_7(X, W, R, B, sequence_lens, initial_h, activation_alpha=activation_alpha,
                 activation_beta=activation_beta, activations=activations, clip=clip,
                 direction=direction, hidden_size=hidden_size)


# ---------------------------------------------------------------------------------------------
# GRU


@op("GRU", since=14, contract=_contract(_ALLOWED_14))
def GRU(X, W, R, B=None, sequence_lens=None, initial_h=None, *, activation_alpha=None,
        activation_beta=None, activations=None, clip=None, direction="forward",
        hidden_size=None, layout=0, linear_before_reset=0):
    """Gated recurrent unit, gates z|r|h (ONNX GRU-14)."""
    return _gru(X, W, R, B, sequence_lens, initial_h, activation_alpha=activation_alpha,
                activation_beta=activation_beta, activations=activations, clip=clip,
                direction=direction, hidden_size=hidden_size, layout=layout,
                linear_before_reset=linear_before_reset)


@op("GRU", since=7, contract=_contract(_ALLOWED))
def GRU_7(X, W, R, B=None, sequence_lens=None, initial_h=None, *, activation_alpha=None,
          activation_beta=None, activations=None, clip=None, direction="forward",
          hidden_size=None, linear_before_reset=0):
    """Gated recurrent unit, sequence-major layout only (ONNX GRU-7)."""
    return _gru(X, W, R, B, sequence_lens, initial_h, activation_alpha=activation_alpha,
                activation_beta=activation_beta, activations=activations, clip=clip,
                direction=direction, hidden_size=hidden_size, layout=0,
                linear_before_reset=linear_before_reset)


@op("GRU", since=3, contract=_contract(_ALLOWED))
def GRU_3(X, W, R, B=None, sequence_lens=None, initial_h=None, *, activation_alpha=None,
          activation_beta=None, activations=None, clip=None, direction="forward",
          hidden_size=None, linear_before_reset=0, output_sequence=0):
    """Gated recurrent unit with linear_before_reset and output_sequence (ONNX GRU-3)."""
    return GRU_7(X, W, R, B, sequence_lens, initial_h, activation_alpha=activation_alpha,
                 activation_beta=activation_beta, activations=activations, clip=clip,
                 direction=direction, hidden_size=hidden_size,
                 linear_before_reset=linear_before_reset)


@op("GRU", since=1, contract=_contract(_ALLOWED))
def GRU_1(X, W, R, B=None, sequence_lens=None, initial_h=None, *, activation_alpha=None,
          activation_beta=None, activations=None, clip=None, direction="foward",
          hidden_size=None, output_sequence=0):
    """Gated recurrent unit; its default direction is spelt 'foward' (ONNX GRU-1)."""
    return GRU_7(X, W, R, B, sequence_lens, initial_h, activation_alpha=activation_alpha,
                 activation_beta=activation_beta, activations=activations, clip=clip,
                 direction=direction, hidden_size=hidden_size, linear_before_reset=0)


# ---------------------------------------------------------------------------------------------
# LSTM


@op("LSTM", since=14, contract=_contract(_ALLOWED_14))
def LSTM(X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None, *,
         activation_alpha=None, activation_beta=None, activations=None, clip=None,
         direction="forward", hidden_size=None, input_forget=0, layout=0):
    """Long short-term memory, gates i|o|f|c, peepholes i|o|f (ONNX LSTM-14)."""
    return _lstm(X, W, R, B, sequence_lens, initial_h, initial_c, P,
                 activation_alpha=activation_alpha, activation_beta=activation_beta,
                 activations=activations, clip=clip, direction=direction,
                 hidden_size=hidden_size, layout=layout, input_forget=input_forget)


@op("LSTM", since=7, contract=_contract(_ALLOWED))
def LSTM_7(X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None, *,
           activation_alpha=None, activation_beta=None, activations=None, clip=None,
           direction="forward", hidden_size=None, input_forget=0):
    """Long short-term memory, sequence-major layout only (ONNX LSTM-7)."""
    return _lstm(X, W, R, B, sequence_lens, initial_h, initial_c, P,
                 activation_alpha=activation_alpha, activation_beta=activation_beta,
                 activations=activations, clip=clip, direction=direction,
                 hidden_size=hidden_size, layout=0, input_forget=input_forget)


@op("LSTM", since=1, contract=_contract(_ALLOWED))
def LSTM_1(X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None, *,
           activation_alpha=None, activation_beta=None, activations=None, clip=None,
           direction="forward", hidden_size=None, input_forget=0, output_sequence=0):
    """Long short-term memory; output_sequence only marks Y optional (ONNX LSTM-1)."""
    return LSTM_7(X, W, R, B, sequence_lens, initial_h, initial_c, P,
                  activation_alpha=activation_alpha, activation_beta=activation_beta,
                  activations=activations, clip=clip, direction=direction,
                  hidden_size=hidden_size, input_forget=input_forget)
