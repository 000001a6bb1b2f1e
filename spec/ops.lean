-- The thirteen entry points of the convolution and pooling tape, as the seed documents them.
-- `convgen build` turns each declaration into validators, an op table and CUDA kernels.
-- The N-D ops end in the optional arguments of SEMANTICS §8 (`(groups : ℕ := 1)`); their defaults
-- leave each op the seed's.

/-- Conv2D forward/backward via ConvPool FFI (single image, channels-first). -/
def Runtime.Autograd.Cuda.Tape.conv2d {inC outC kH kW stride padding inH inW : ℕ} {h1 : inC ≠ 0} {h2 : kH ≠ 0} {h3 : kW ≠ 0} (t : Tape) (kernelId biasId inputId : ℕ) : Result (Tape × ℕ)

/-- ConvTranspose2D forward/backward via ConvPool FFI (single image, channels-first). -/
def Runtime.Autograd.Cuda.Tape.convTranspose2d {inC outC kH kW stride padding inH inW : ℕ} {h1 : inC ≠ 0} {h2 : kH ≠ 0} {h3 : kW ≠ 0} (t : Tape) (kernelId biasId inputId : ℕ) : Result (Tape × ℕ)

/-- N-D convolution (CUDA) via ConvPool FFI (rank $\le 8$). -/
def Runtime.Autograd.Cuda.Tape.conv {d inC outC : ℕ} {kernel stride padding inSpatial : Vector ℕ d} (t : Tape) (kernelId biasId inputId : ℕ) (hInC : inC ≠ 0) (hKernel : ∀ (i : Fin d), kernel.get i ≠ 0) (batch : Option ℕ := none) (dilation : Vector ℕ d := 1) (groups : ℕ := 1) (paddingMode : PaddingMode := zeros) : Result (Tape × ℕ)

/-- N-D transposed convolution (CUDA) via ConvPool FFI (rank $\le 8$). -/
def Runtime.Autograd.Cuda.Tape.convTranspose {d inC outC : ℕ} {kernel stride padding inSpatial : Vector ℕ d} (t : Tape) (kernelId biasId inputId : ℕ) (hInC : inC ≠ 0) (hKernel : ∀ (i : Fin d), kernel.get i ≠ 0) (batch : Option ℕ := none) (dilation : Vector ℕ d := 1) (groups : ℕ := 1) (outputPadding : Vector ℕ d := 0) : Result (Tape × ℕ)

/-- MaxPool2D via ConvPool FFI (no padding). -/
def Runtime.Autograd.Cuda.Tape.maxPool2d {kH kW inH inW inC stride : ℕ} {h1 : kH ≠ 0} {h2 : kW ≠ 0} (t : Tape) (xId : ℕ) : Result (Tape × ℕ)

/-- MaxPool2D via ConvPool FFI (with symmetric padding). -/
def Runtime.Autograd.Cuda.Tape.maxPool2dPad {kH kW inH inW inC stride padding : ℕ} {h1 : kH ≠ 0} {h2 : kW ≠ 0} (t : Tape) (xId : ℕ) : Result (Tape × ℕ)

/-- N-D max pooling (CUDA) via ConvPool FFI (rank $\le 8$). -/
def Runtime.Autograd.Cuda.Tape.maxPool {d C : ℕ} {inSpatial kernel stride padding : Vector ℕ d} {hKernel : ∀ (i : Fin d), kernel.get i ≠ 0} (t : Tape) (xId : ℕ) (batch : Option ℕ := none) (dilation : Vector ℕ d := 1) : Result (Tape × ℕ)

/-- Smooth max-pool2d (log-sum-exp surrogate) via ConvPool FFI, without padding.
  beta is checked after conversion to Float32, because conversion can underflow a nonzero Float to zero or overflow a finite one to infinity. -/
def Runtime.Autograd.Cuda.Tape.smoothMaxPool2d {kH kW inH inW inC stride : ℕ} {h1 : kH ≠ 0} {h2 : kW ≠ 0} (t : Tape) (xId : ℕ) (beta : Float) : Result (Tape × ℕ)

/-- Smooth max-pool2d (log-sum-exp surrogate) via ConvPool FFI, with symmetric padding.
  beta is checked after conversion to Float32, because conversion can underflow a nonzero Float to zero or overflow a finite one to infinity. -/
def Runtime.Autograd.Cuda.Tape.smoothMaxPool2dPad {kH kW inH inW inC stride padding : ℕ} {h1 : kH ≠ 0} {h2 : kW ≠ 0} (t : Tape) (xId : ℕ) (beta : Float) : Result (Tape × ℕ)

/-- N-D smooth max pooling via the CUDA ConvPool FFI (rank at most eight).
  beta is checked after conversion to Float32, because conversion can underflow a nonzero Float to zero or overflow a finite one to infinity. -/
def Runtime.Autograd.Cuda.Tape.smoothMaxPool {d C : ℕ} {inSpatial kernel stride padding : Vector ℕ d} {hKernel : ∀ (i : Fin d), kernel.get i ≠ 0} (t : Tape) (xId : ℕ) (beta : Float) (batch : Option ℕ := none) (dilation : Vector ℕ d := 1) : Result (Tape × ℕ)

/-- AvgPool2D via ConvPool FFI (no padding). -/
def Runtime.Autograd.Cuda.Tape.avgPool2d {kH kW inH inW inC stride : ℕ} (h1 : kH ≠ 0) (h2 : kW ≠ 0) (t : Tape) (xId : ℕ) : Result (Tape × ℕ)

/-- AvgPool2D via ConvPool FFI (with symmetric padding). -/
def Runtime.Autograd.Cuda.Tape.avgPool2dPad {kH kW inH inW inC stride padding : ℕ} (h1 : kH ≠ 0) (h2 : kW ≠ 0) (t : Tape) (xId : ℕ) : Result (Tape × ℕ)

/-- N-D average pooling (CUDA) via ConvPool FFI (rank $\le 8$). -/
def Runtime.Autograd.Cuda.Tape.avgPool {d C : ℕ} {inSpatial kernel stride padding : Vector ℕ d} (hKernel : ∀ (i : Fin d), kernel.get i ≠ 0) (t : Tape) (xId : ℕ) (batch : Option ℕ := none) (dilation : Vector ℕ d := 1) : Result (Tape × ℕ)
