//! The lowering context: a StableHLO builder plus the record of which module inputs come from
//! runtime scalars, and the helpers every lowering shares (broadcasting, casts, dims).
use crate::args::{Scalar, Tensor};
use crate::dtype::{DType, Rank};
use crate::error::Result;
use crate::{bail, check};
use stablehlo::{Builder, ElemType, TensorType, Value};

/// What feeds one parameter of the module at run time.
#[derive(Clone, Debug, PartialEq)]
pub enum Feed {
    /// A float scalar argument (slot), converted to `elem` on the host.
    Scalar { slot: u32, elem: ElemType },
    /// An input the caller (engine or graph compiler) created and tagged.
    External(u32),
}

pub struct Cx {
    pub b: Builder,
    pub feeds: Vec<Feed>,
}

impl std::ops::Deref for Cx {
    type Target = Builder;
    fn deref(&self) -> &Builder {
        &self.b
    }
}
impl std::ops::DerefMut for Cx {
    fn deref_mut(&mut self) -> &mut Builder {
        &mut self.b
    }
}

impl Default for Cx {
    fn default() -> Self {
        Self::new()
    }
}

impl Cx {
    pub fn new() -> Self {
        Cx { b: Builder::new(), feeds: Vec::new() }
    }

    /// A module parameter fed by the caller; `tag` says which of its inputs.
    pub fn external_param(&mut self, ty: TensorType, tag: u32) -> Value {
        self.feeds.push(Feed::External(tag));
        self.b.param(ty)
    }

    pub fn dims(&self, v: Value) -> Vec<i64> {
        self.b.dims(v).to_vec()
    }

    pub fn numel(&self, v: Value) -> i64 {
        self.b.dims(v).iter().product()
    }

    pub fn dtype(&self, v: Value) -> DType {
        DType::from_elem(self.b.elem(v))
    }

    /// A scalar as a 0-d value of `dtype`: ints and bools are constants, floats are runtime
    /// inputs (unless compiled in).
    pub fn scalar(&mut self, s: Scalar, dtype: DType) -> Value {
        let elem = dtype.elem();
        match s {
            Scalar::Int(i) => self.b.constant_i64(i, elem),
            Scalar::Bool(x) => self.b.constant_i64(x as i64, elem),
            Scalar::Float(f) => match f.slot {
                Some(slot) => {
                    self.feeds.push(Feed::Scalar { slot, elem });
                    self.b.param(TensorType { elem, dims: vec![] })
                }
                None => self.b.constant_f64(f.value, elem),
            },
        }
    }

    /// A scalar as a value of dtype `dtype` broadcast to `dims`.
    pub fn scalar_like(&mut self, s: Scalar, dtype: DType, dims: &[i64]) -> Value {
        let v = self.scalar(s, dtype);
        self.b.broadcast_in_dim(v, dims, &[])
    }

    pub fn full(&mut self, x: f64, dtype: DType, dims: &[i64]) -> Value {
        let v = self.b.constant_f64(x, dtype.elem());
        self.b.broadcast_in_dim(v, dims, &[])
    }

    pub fn cast(&mut self, v: Value, dtype: DType) -> Value {
        let from = self.dtype(v);
        if from == dtype {
            return v;
        }
        if dtype == DType::Bool {
            // PyTorch: nonzero is true (a plain convert would do the same, but be explicit for
            // complex and float NaN).
            let zero = self.full(0.0, from, &self.dims(v));
            return self.b.compare(stablehlo::CmpDir::Ne, v, zero);
        }
        self.b.convert(v, dtype.elem())
    }

    /// Broadcast every value to the common shape (PyTorch's error message when they can't).
    pub fn broadcast_all(&mut self, vs: &[Value]) -> Result<Vec<Value>> {
        let shapes: Vec<Vec<i64>> = vs.iter().map(|&v| self.dims(v)).collect();
        let out = broadcast_shapes(&shapes)?;
        Ok(vs.iter().map(|&v| self.b.broadcast_to(v, &out)).collect())
    }
}

/// The broadcast shape of several shapes, with PyTorch's error text.
pub fn broadcast_shapes(shapes: &[Vec<i64>]) -> Result<Vec<i64>> {
    let nd = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![1i64; nd];
    for s in shapes {
        let off = nd - s.len();
        for (i, &d) in s.iter().enumerate() {
            let o = &mut out[off + i];
            if *o == 1 {
                *o = d;
            } else if d != 1 && d != *o {
                // PyTorch names the first mismatching pair, counting dims from the right.
                bail!(
                    Runtime,
                    "The size of tensor a ({}) must match the size of tensor b ({}) at non-singleton dimension {}",
                    *o,
                    d,
                    i + off
                );
            }
        }
    }
    Ok(out)
}

/// Wrap a possibly negative dim like PyTorch's maybe_wrap_dim (0-d tensors accept -1 and 0).
pub fn wrap_dim(dim: i64, ndim: usize) -> Result<usize> {
    let n = ndim.max(1) as i64;
    check!(
        dim >= -n && dim < n,
        Index,
        "Dimension out of range (expected to be in range of [{}, {}], but got {})",
        -n,
        n - 1,
        dim
    );
    Ok(if dim < 0 { (dim + n) as usize } else { dim as usize })
}

/// Operands of a promoting op: tensors and scalars with their ranks.
pub fn operand(t: &Tensor) -> (DType, Rank) {
    (t.dtype, t.rank)
}

pub fn is_floating_or_complex(d: DType) -> bool {
    d.is_float() || d.is_complex()
}
