"""The rule for a gradient's tiny values, shared by the dense CPU kernels' last pass
(``loss/cpu/row_ops.flush_limit``) and the fused joint + loss's apply stage.

A lattice node that paths almost never visit (occupancy like e**-100) has a gradient
row far below any float32 or float64 resolution of the sums it enters downstream (the
joint network's weight and input gradients, of order |f_b|, the utterance's factor).
Left as they are, many of those values are subnormal numbers, and the matmuls of the
backward pass that read the gradient (the output layer's) run several times slower on
CPUs that handle subnormal operands in microcode (bench/RESULTS.md). So values below
``|f_b| * GRADIENT_FLUSH_BELOW`` (at least the dtype's smallest normal number) are
set to 0. No Numba or torch here: the torch-only paths read the constant too.
"""

#: gradient values below ``|f_b| * GRADIENT_FLUSH_BELOW`` are set to 0
GRADIENT_FLUSH_BELOW = 2.0**-80
