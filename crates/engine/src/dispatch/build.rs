//! Building a call's program: lowering it (`Builder`) with its views, writes, returns and
//! checks, then compiling it, exactly or as a bucketed program (buckets.rs).
use super::cache::{entry_id, Entry, Feed, OutSpec, RetSpec};
use super::key::Scan;
use super::lookup::bucketable;
use super::OpInfo;
use crate::abi::*;
use crate::buckets;
use crate::cell::Cell;
use crate::checks;
use crate::compile_pool::{self, Program, Urgency};
use crate::error::Error;
use crate::fused;
use crate::lock::Held;
use crate::runtime::{runtime, FirstBuild, Tiering};
use crate::view::{self, Geometry};
use lowerings::{Arg, Args, Cx, DType, ErrorKind, FloatArg, Out, Rank, Tensor, TorchError};
use stablehlo::{ElemType, TensorType, Value};
use std::sync::Arc;

/// Whether a program is a size program, or is given the size one computed.
#[derive(Copy, Clone)]
pub(super) enum Sizing {
    None,
    Program,
    Known(i64),
}

pub(super) enum Built {
    Entry(Entry),
    Resize(usize, Vec<i64>),
}

pub(super) fn dtype_of(code: i8) -> Result<DType, Error> {
    DType::from_code(code).ok_or_else(|| Error::Torch(TorchError::new(ErrorKind::NotImplemented, format!("torchtpu: {} is not supported on tpu", DType::unsupported_name(code)))))
}

struct Builder<'a> {
    cx: Cx,
    feeds: Vec<Feed>,
    scan: &'a Scan,
    /// The engine lock's token: the builder reads the cells' buffers' types.
    held: &'a Held,
    /// The current value of each distinct cell's base, and whether the call wrote it.
    bases: Vec<Value>,
    written: Vec<bool>,
    next_float: u32,
    specialize: bool,
    /// In a bucketed program (buckets.rs): the geometry parameter, the next unread position in it,
    /// and where each tensor argument's geometry starts.
    bucket: Option<BucketBuild>,
}

struct BucketBuild {
    geo: Value,
    next: usize,
    starts: Vec<(u32, usize)>,
}

impl Builder<'_> {
    fn new<'a>(scan: &'a Scan, held: &'a Held, specialize: bool) -> Builder<'a> {
        Builder { cx: Cx::new(), feeds: Vec::new(), scan, held, bases: Vec::new(), written: Vec::new(), next_float: 0, specialize, bucket: None }
    }

    fn feed(&mut self, ty: TensorType, feed: Feed) -> Value {
        let tag = self.feeds.len() as u32;
        let host = matches!(feed, Feed::Host(..));
        self.feeds.push(feed);
        if host {
            self.cx.host_param(ty, tag)
        } else {
            self.cx.external_param(ty, tag)
        }
    }

    fn base(&mut self, slot: u32, t: &TtTensor) -> Result<Value, Error> {
        while self.bases.len() <= slot as usize {
            // SAFETY: the call's arguments keep their cells alive.
            let cell = unsafe { &*self.scan.cells[self.bases.len()] };
            let v = match cell.get(self.held) {
                Some(s) => self.feed(TensorType { elem: s.dtype.elem(), dims: s.dims.clone() }, Feed::Base(self.bases.len() as u32)),
                None => {
                    let dt = dtype_of(t.dtype)?;
                    let mut n = cell.nbytes() / dt.size() as i64;
                    if self.bucket.is_some() {
                        // Its buffer will hold a bucket, like a bucketed result's.
                        n = buckets::bucket(n);
                    }
                    self.cx.full(0.0, dt, &[n])
                }
            };
            self.bases.push(v);
            self.written.push(false);
        }
        Ok(self.bases[slot as usize])
    }

    fn tensor(&mut self, arg: u32, item: i32, t: &TtTensor) -> Result<Tensor, Error> {
        let dtype = dtype_of(t.dtype)?;
        let rank = if t.flags & TT_WRAPPED_NUMBER != 0 {
            Rank::Wrapped
        } else if t.ndim == 0 {
            Rank::ZeroDim
        } else {
            Rank::Dim
        };
        if t.is_host() {
            let v = self.feed(TensorType { elem: dtype.elem(), dims: t.sizes().to_vec() }, Feed::Host(arg, item));
            return Ok(Tensor { v, dtype, rank });
        }
        let slot = self.scan.cells.iter().position(|&c| c == t.cell as *mut Cell).unwrap() as u32;
        let mut base = self.base(slot, t)?;
        if let Some(sb) = &mut self.bucket {
            // Servable calls read views in their storage's dtype (buckets::servable).
            let (geo, at) = (sb.geo, sb.next);
            sb.next += 1 + 2 * t.sizes().len();
            sb.starts.push((arg, at));
            let v = buckets::read(&mut self.cx, base, geo, at, &buckets::padded(t.sizes()));
            if self.cx.padded.is_some() {
                let real = buckets::real_sizes(&mut self.cx, geo, at, t.sizes().len());
                self.cx.padded.as_mut().unwrap().real.push((v, real));
            }
            return Ok(Tensor { v, dtype, rank });
        }
        if self.cx.dtype(base) != dtype {
            // A view with another dtype than its storage's (view(dtype), view_as_real, ...).
            base = view::reinterpret(&mut self.cx, base, dtype);
        }
        let g = Geometry { sizes: t.sizes(), strides: t.strides(), offset: t.offset };
        let v = view::read(&mut self.cx, base, &g);
        Ok(Tensor { v, dtype, rank })
    }

    fn arg(&mut self, i: u32, item: i32, a: &TtArg) -> Result<Arg, Error> {
        Ok(match a.kind {
            TT_NONE => Arg::None,
            TT_TENSOR => Arg::Tensor(self.tensor(i, item, a.tensor())?),
            TT_INT => Arg::Int(a.int()),
            TT_BOOL => Arg::Bool(a.int() != 0),
            TT_FLOAT => {
                let value = self.scan.floats[self.next_float as usize];
                let slot = if self.specialize { None } else { Some(self.next_float) };
                self.next_float += 1;
                Arg::Float(FloatArg { value, slot })
            }
            TT_COMPLEX => {
                let c = unsafe { a.p.c };
                Arg::Complex(c.re, c.im)
            }
            TT_INT_LIST => Arg::IntList(a.list::<i64>().to_vec()),
            TT_FLOAT_LIST => Arg::FloatList(a.list::<f64>().to_vec()),
            TT_BOOL_LIST => Arg::BoolList(a.list::<u8>().iter().map(|&b| b != 0).collect()),
            TT_TENSOR_LIST => {
                let mut items = Vec::new();
                for (j, it) in a.list::<TtArg>().iter().enumerate() {
                    items.push(self.arg(i, j as i32, it)?);
                }
                Arg::List(items)
            }
            TT_STR => Arg::Str(String::from_utf8_lossy(a.list::<u8>()).into_owned()),
            TT_SCALAR_TYPE => Arg::DType(dtype_of(a.int() as i8)?),
            TT_GENERATOR => {
                let v = self.feed(TensorType { elem: ElemType::U64, dims: vec![2] }, Feed::Rng(i));
                Arg::Generator(v)
            }
            _ => Arg::Other,
        })
    }

    /// Writes `v` into the tensor argument `t` (in-place or out=).
    fn write(&mut self, info: &OpInfo, arg: usize, t: &TtTensor, v: Value) -> Result<Option<Built>, Error> {
        let dtype = dtype_of(t.dtype)?;
        let got = self.cx.dtype(v);
        if !lowerings::can_cast(got, dtype) {
            return Err(Error::Torch(TorchError::new(
                ErrorKind::Runtime,
                format!("result type {} can't be cast to the desired output type {}", got.torch_name(), dtype.torch_name()),
            )));
        }
        let dims = self.cx.dims(v);
        if let Some(sb) = &self.bucket {
            let padded = buckets::padded(t.sizes());
            if dims != padded {
                return Err(Error::runtime(format!("torchtpu: bucketed {}: result {:?} for a written {:?}", info.base, dims, padded)));
            }
            let (geo, at) = (sb.geo, sb.starts.iter().find(|s| s.0 as usize == arg).expect("a written tensor was read first").1);
            let v = self.cx.cast(v, dtype);
            let slot = self.scan.cells.iter().position(|&c| c == t.cell as *mut Cell).unwrap();
            let base = self.base(slot as u32, t)?;
            self.bases[slot] = buckets::write(&mut self.cx, base, geo, at, &padded, v);
            self.written[slot] = true;
            return Ok(None);
        }
        if dims.as_slice() != t.sizes() {
            if info.inplace {
                return Err(Error::Torch(TorchError::new(
                    ErrorKind::Runtime,
                    format!("output with shape {:?} doesn't match the broadcast shape {:?}", t.sizes(), dims),
                )));
            }
            return Ok(Some(Built::Resize(arg, dims)));
        }
        let v = self.cx.cast(v, dtype);
        let slot = self.scan.cells.iter().position(|&c| c == t.cell as *mut Cell).unwrap();
        let base = self.base(slot as u32, t)?;
        let g = Geometry { sizes: t.sizes(), strides: t.strides(), offset: t.offset };
        let nb = if self.cx.dtype(base) != dtype {
            // Written through a view of another dtype: write the reinterpreted base. The buffer
            // then keeps the writer's dtype where its bytes are the same either way, so that a
            // storage allocated as raw bytes and used as floats (vLLM's KV cache) is updated in
            // place from then on, instead of converted whole on every write.
            let seen = view::reinterpret(&mut self.cx, base, dtype);
            let written = view::write(&mut self.cx, seen, &g, v);
            let (from, elems) = (self.cx.dtype(base), self.cx.numel(base));
            if view::same_bytes_as(from, elems, dtype) { written } else { view::restore(&mut self.cx, written, base) }
        } else {
            view::write(&mut self.cx, base, &g, v)
        };
        self.bases[slot] = nb;
        self.written[slot] = true;
        Ok(None)
    }
}

/// What a program computes (`results`, each described by its `OutSpec`) and how the call's
/// returns are made of them.
#[derive(Default)]
struct Outputs {
    results: Vec<Value>,
    specs: Vec<OutSpec>,
    returns: Vec<RetSpec>,
}

impl Outputs {
    /// A new result the call returns; its index.
    fn push_new(&mut self, cx: &Cx, v: Value) -> usize {
        self.results.push(v);
        self.specs.push(OutSpec::New { dtype: cx.dtype(v), dims: cx.dims(v) });
        self.results.len() - 1
    }
}

/// Lowers one call into a program and compiles it, in these steps.
/// `promotion`: the program of a shape a bucketed program served (lookup): it compiles on a
/// worker thread, and stores its new results as the bucketed program did (flat, at their
/// bucket's capacity), so that the ops reading them keep their keys and their counts.
#[allow(clippy::too_many_arguments)]
pub(super) fn build(info: &OpInfo, f: lowerings::LowerFn, specialize: bool, args: &[TtArg], scan: &Scan, held: &Held, sizing: Sizing, promotion: bool) -> Result<Built, Error> {
    let mut b = Builder::new(scan, held, specialize);
    let lowered = b.lower_call(info, f, args, sizing)?;
    let mut outs = lowered.into_iter();
    if let Some(resize) = b.write_arguments(info, args, sizing, &mut outs)? {
        return Ok(resize);
    }
    let mut o = b.returned_outputs(outs);
    let tiering = if bucketable(info) {
        Tiering::Class(buckets::size_class(args, o.specs.iter().map(OutSpec::dims)))
    } else {
        Tiering::Largest
    };
    if promotion {
        for (v, spec) in o.results.iter_mut().zip(o.specs.iter_mut()) {
            if let OutSpec::New { dims, .. } = spec {
                *v = buckets::pad_flat(&mut b.cx, *v, buckets::capacity(dims));
                *dims = b.cx.dims(*v);
            }
        }
    }
    b.append_written_bases(&mut o);
    let (host_checks, checks) = b.attach_checks(info, &mut o.results)?;
    let feeds = b.ordered_feeds();
    let aliases = donate_written_buffers(&b.cx, &feeds, &o.results, &mut o.specs);
    let module_override = b.cx.module_override.take();
    let text = b.cx.b.finish_with_aliases(&o.results, &aliases);
    let kept = module_override.is_none().then(|| Arc::from(text.as_str()));
    let constants = constant_scalars(&text, o.specs.len());
    let (exe, quick) = match module_override {
        Some(module) => (compile_module(info, &module)?, false),
        None => compile_program(info, text, tiering, promotion)?,
    };
    Ok(Built::Entry(Entry { exe, quick, id: entry_id(), op: info.qualified.as_str().into(), text: kept, constants, feeds, results: o.specs, returns: o.returns, host_checks, checks }))
}

/// For each of a program's first `n` results, its little-endian bytes where it is a constant
/// 0-d i64 or i32 (`%v = "stablehlo.constant"() {value = dense<N> : tensor<i64>}`, maybe
/// through 0-d broadcasts).
fn constant_scalars(text: &str, n: usize) -> Vec<Option<[u8; 8]>> {
    let Some(ret) = text.lines().find(|l| l.trim_start().starts_with("\"func.return\"(")) else { return vec![None; n] };
    let names = ret.split_once('(').and_then(|(_, r)| r.split_once(')')).map_or("", |(names, _)| names);
    let definition = |name: &str| {
        let def = format!("{name} = ");
        text.lines().map(str::trim_start).find(|l| l.starts_with(&def)).map(|l| &l[def.len()..])
    };
    names
        .split(", ")
        .take(n)
        .map(|name| {
            let mut line = definition(name)?;
            for _ in 0..4 {
                let Some(src) = line.strip_prefix("\"stablehlo.broadcast_in_dim\"(") else { break };
                let (src, rest) = src.split_once(')')?;
                if !rest.ends_with(": (tensor<i64>) -> tensor<i64>") && !rest.ends_with(": (tensor<i32>) -> tensor<i32>") {
                    return None;
                }
                line = definition(src)?;
            }
            let lit = line.strip_prefix("\"stablehlo.constant\"() {value = dense<")?;
            let (lit, ty) = lit.split_once("> : tensor<")?;
            let x: i64 = lit.parse().ok()?;
            match ty.split('>').next()? {
                "i64" => Some(x.to_le_bytes()),
                "i32" => Some((x as i64).to_le_bytes()),
                _ => None,
            }
        })
        .chain(std::iter::repeat(None))
        .take(n)
        .collect()
}

pub(super) enum Dry {
    Resize(usize, Vec<i64>),
    /// The lowering replaces the module, or adds checks a bucketed program cannot make: not
    /// for a bucketed program.
    Exact,
    /// The sizes of the new results, their constants (Entry::constants), and the failure ids
    /// of the call's device checks, member by member (`bucketed_failure_ids`).
    Results(Vec<Vec<i64>>, Vec<Option<[u8; 8]>>, Vec<i64>),
}

/// Lowers the call at its exact shapes without compiling (see lookup_bucketed).
pub(super) fn dry_run(info: &OpInfo, f: lowerings::LowerFn, specialize: bool, args: &[TtArg], scan: &Scan, held: &Held) -> Result<Dry, Error> {
    let mut b = Builder::new(scan, held, specialize);
    let lowered = b.lower_call(info, f, args, Sizing::None)?;
    let mut outs = lowered.into_iter();
    if let Some(r) = b.write_arguments(info, args, Sizing::None, &mut outs)? {
        let Built::Resize(i, dims) = r else { unreachable!("writes resize or succeed") };
        return Ok(Dry::Resize(i, dims));
    }
    let o = b.returned_outputs(outs);
    let Some(failures) = bucketed_failure_ids(info, &b.cx.checks).filter(|_| b.cx.module_override.is_none()) else {
        return Ok(Dry::Exact);
    };
    // Only a 0-d result can be a constant number: most calls skip printing the module.
    let n = o.specs.len();
    let constants = if o.specs.iter().any(|s| s.dims().is_empty()) { constant_scalars(&b.cx.b.finish_with_aliases(&o.results, &[]), n) } else { vec![None; n] };
    Ok(Dry::Results(o.specs.iter().map(|s| s.dims().to_vec()).collect(), constants, failures))
}

/// A bucketed program's checks (an op declared `.bucketed()` that checks its indices against
/// its inputs' real sizes) report the messages of the call's exact shapes ("... with size 5"):
/// their failure ids, computed here from the exact lowering's checks, are runtime inputs
/// (after the result sizes in the geometry). None if a check is made on the host.
fn bucketed_failure_ids(info: &OpInfo, checks: &[lowerings::Check]) -> Option<Vec<i64>> {
    if checks.is_empty() {
        return Some(Vec::new());
    }
    if !info.lowering.is_some_and(|l| l.bucketed) {
        return None;
    }
    let mut ids = Vec::new();
    for c in checks {
        if !matches!(c.eval, lowerings::CheckEval::Device(_)) {
            return None;
        }
        ids.extend(c.messages.iter().map(|m| checks::failure_id(c.kind, m, &info.base)));
    }
    Some(ids)
}

/// Lowers and compiles the bucketed program of a call (buckets.rs); None if the op's lowering does
/// not keep the padded shapes (then the call compiles exactly).
#[allow(clippy::too_many_arguments)]
pub(super) fn build_bucketed(info: &OpInfo, f: lowerings::LowerFn, specialize: bool, args: &[TtArg], scan: &Scan, held: &Held, geometry: &[i64], dims: &[Vec<i64>]) -> Result<Option<Entry>, Error> {
    let mut b = Builder::new(scan, held, specialize);
    let geo = b.feed(TensorType { elem: ElemType::I64, dims: vec![geometry.len() as i64] }, Feed::Geometry);
    b.bucket = Some(BucketBuild { geo, next: 0, starts: Vec::new() });
    if info.lowering.is_some_and(|l| l.bucketed) {
        b.cx.padded = Some(lowerings::Padded { real: Vec::new(), results: dims.iter().map(|d| buckets::padded(d)).collect(), declined: false });
    }
    let lowered = b.lower_call(info, f, args, Sizing::None)?;
    if b.cx.padded.as_ref().is_some_and(|p| p.declined) {
        return Ok(None);
    }
    let mut outs = lowered.into_iter();
    if b.write_arguments(info, args, Sizing::None, &mut outs)?.is_some() {
        return Ok(None);
    }
    let mut o = b.returned_outputs(outs);
    let mut at = b.bucket.as_ref().unwrap().next;
    for (i, d) in dims.iter().enumerate() {
        let padded = buckets::padded(d);
        if b.cx.dims(o.results[i]) != padded {
            return Ok(None);
        }
        let flat = buckets::flatten(&mut b.cx, o.results[i], geo, at, &padded, buckets::capacity(d));
        at += d.len();
        o.specs[i] = OutSpec::New { dtype: b.cx.dtype(flat), dims: b.cx.dims(flat) };
        o.results[i] = flat;
    }
    b.append_written_bases(&mut o);
    // The failure ids follow the result sizes in the geometry (lookup_bucketed).
    let Some(checks) = b.attach_bucketed_checks(geo, at, geometry.len() - at, &mut o.results) else {
        return Ok(None);
    };
    let feeds = b.ordered_feeds();
    let aliases = donate_written_buffers(&b.cx, &feeds, &o.results, &mut o.specs);
    let text = b.cx.b.finish_with_aliases(&o.results, &aliases);
    let class = buckets::size_class(args, dims.iter().map(Vec::as_slice));
    let kept = Some(Arc::from(text.as_str()));
    let constants = constant_scalars(&text, o.specs.len());
    let (exe, quick) = compile_program(info, text, Tiering::Class(class), false)?;
    Ok(Some(Entry { exe, quick, id: entry_id(), op: info.qualified.as_str().into(), text: kept, constants, feeds, results: o.specs, returns: o.returns, host_checks: Vec::new(), checks }))
}

/// An argument's tensors' strides as the lowering sees them (`Args::strides`): a host tensor
/// is fed dense, and an empty one's strides are not in the cache key (one program serves them
/// all).
fn arg_strides(a: &TtArg) -> Vec<Vec<i64>> {
    let of = |t: &TtTensor| {
        if t.is_host() || t.sizes().contains(&0) {
            lowerings::contiguous_strides(t.sizes())
        } else {
            t.strides().to_vec()
        }
    };
    match a.kind {
        TT_TENSOR => vec![of(a.tensor())],
        TT_TENSOR_LIST => a.list::<TtArg>().iter().map(|it| if it.kind == TT_TENSOR { of(it.tensor()) } else { Vec::new() }).collect(),
        _ => Vec::new(),
    }
}

impl Builder<'_> {
    /// The call's arguments as the lowering's values (CPU tensors with dimensions only where
    /// the op takes them), the computed size where there is one, and the op's lowering on them.
    fn lower_call(&mut self, info: &OpInfo, f: lowerings::LowerFn, args: &[TtArg], sizing: Sizing) -> Result<Vec<Out>, Error> {
        let mut values = Vec::with_capacity(args.len());
        for (i, a) in args.iter().enumerate() {
            if a.kind == TT_TENSOR && a.tensor().is_host() && a.tensor().ndim > 0 && !host_tensors_allowed(&info.base) {
                return Err(Error::Torch(TorchError::new(
                    ErrorKind::Runtime,
                    "Expected all tensors to be on the same device, but found at least two devices, tpu:0 and cpu!",
                )));
            }
            values.push(self.arg(i as u32, -1, a)?);
        }
        // Strides are in the cache key of a call's own program (not of a bucketed one).
        let strides: Vec<Vec<Vec<i64>>> = match self.bucket {
            Some(_) => Vec::new(),
            None => args.iter().map(arg_strides).collect(),
        };
        let mut names = std::borrow::Cow::Borrowed(&info.arg_names[..]);
        if let Sizing::Known(n) = sizing {
            names.to_mut().push("__size".to_string());
            values.push(Arg::Int(n));
        }
        let args = Args { op: &info.base, names: &names, values: &values, strides: &strides };
        if let Some(decl) = &info.lowering {
            lowerings::float4::check(decl, &args).map_err(Error::Torch)?;
        }
        f(&mut self.cx, &args).map_err(Error::Torch)
    }

    /// The first outputs go to the written arguments (in-place, out=), in order. Some(Resize)
    /// when an out= argument must be resized first.
    fn write_arguments(&mut self, info: &OpInfo, args: &[TtArg], sizing: Sizing, outs: &mut impl Iterator<Item = Out>) -> Result<Option<Built>, Error> {
        let write_args = if matches!(sizing, Sizing::Program) { &[][..] } else { &info.write_args[..] };
        for &w in write_args {
            let a = &args[w];
            match a.kind {
                TT_NONE => continue,
                TT_TENSOR => match outs.next() {
                    Some(Out::Tensor(v)) => {
                        if let Some(r) = self.write(info, w, a.tensor(), v)? {
                            return Ok(Some(r));
                        }
                    }
                    _ => return Err(Error::runtime(format!("torchtpu: lowering of {} gave no tensor for written argument {}", info.base, info.arg_names[w]))),
                },
                TT_TENSOR_LIST => match outs.next() {
                    Some(Out::List(vs)) if vs.len() == a.list::<TtArg>().len() => {
                        for (item, v) in a.list::<TtArg>().iter().zip(vs) {
                            if let Some(r) = self.write(info, w, item.tensor(), v)? {
                                return Ok(Some(r));
                            }
                        }
                    }
                    _ => return Err(Error::runtime(format!("torchtpu: lowering of {} gave no list for written argument {}", info.base, info.arg_names[w]))),
                },
                _ => return Err(Error::runtime(format!("torchtpu: {} writes an argument of an unsupported kind", info.base))),
            }
        }
        Ok(None)
    }

    /// The remaining outputs are the call's returns: each tensor a new result.
    fn returned_outputs(&self, outs: impl Iterator<Item = Out>) -> Outputs {
        let mut o = Outputs::default();
        for out in outs {
            match out {
                Out::Tensor(v) => {
                    let i = o.push_new(&self.cx, v);
                    o.returns.push(RetSpec::Tensor(i));
                }
                Out::List(vs) => {
                    let idx = vs.iter().map(|&v| o.push_new(&self.cx, v)).collect();
                    o.returns.push(RetSpec::List(idx));
                }
                Out::Undefined => o.returns.push(RetSpec::Undefined),
            }
        }
        o
    }

    /// After them, the new base of each cell the call wrote.
    fn append_written_bases(&self, o: &mut Outputs) {
        for (slot, &w) in self.written.iter().enumerate() {
            if w {
                let v = self.bases[slot];
                o.results.push(v);
                o.specs.push(OutSpec::Base { slot: slot as u32, dtype: self.cx.dtype(v), dims: self.cx.dims(v), donated: false });
            }
        }
    }

    /// Data-dependent checks: host ones run before the program; device ones update the
    /// device's check accumulator, then the program's last result. Returns the host checks
    /// and whether there are device ones.
    fn attach_checks(&mut self, info: &OpInfo, results: &mut Vec<Value>) -> Result<(Vec<checks::HostCheck>, bool), Error> {
        let mut host_checks = Vec::new();
        let mut first: Option<Value> = None;
        for c in std::mem::take(&mut self.cx.checks) {
            match c.eval {
                lowerings::CheckEval::Host { members, shape } => {
                    let members = members
                        .into_iter()
                        .map(|m| match self.feeds[m.tag as usize] {
                            Feed::Host(arg, item) => Ok((arg, item, m.dims, m.lo, m.hi)),
                            _ => Err(Error::runtime("torchtpu: a host check on an input that is not a host tensor")),
                        })
                        .collect::<Result<_, Error>>()?;
                    host_checks.push(checks::HostCheck { kind: c.kind, messages: c.messages, members, shape });
                }
                lowerings::CheckEval::Device(v) => {
                    let ids: Vec<Value> = c
                        .messages
                        .iter()
                        .map(|m| {
                            let id = self.cx.b.constant_i64(checks::failure_id(c.kind, m, &info.base), ElemType::I64);
                            self.cx.b.broadcast_in_dim(id, &[1], &[])
                        })
                        .collect();
                    let row = failure_row(&mut self.cx, v, &ids);
                    first = Some(match first {
                        None => row,
                        Some(prev) => keep_first(&mut self.cx, prev, row),
                    });
                }
            }
        }
        Ok((host_checks, self.update_check_acc(first, results)))
    }

    /// A bucketed program's device checks, their failure ids read from the geometry
    /// (`count` of them from `at`). Whether it has any; None if the lowering made a different
    /// number of check members than the exact shapes' lowering did.
    fn attach_bucketed_checks(&mut self, geo: Value, at: usize, count: usize, results: &mut Vec<Value>) -> Option<bool> {
        let mut first: Option<Value> = None;
        let mut next = at;
        for c in std::mem::take(&mut self.cx.checks) {
            let lowerings::CheckEval::Device(v) = c.eval else { return None };
            if next + c.messages.len() > at + count {
                return None;
            }
            let ids: Vec<Value> = (next..next + c.messages.len()).map(|i| self.cx.b.slice(geo, &[i as i64], &[i as i64 + 1], &[1])).collect();
            next += ids.len();
            let row = failure_row(&mut self.cx, v, &ids);
            first = Some(match first {
                None => row,
                Some(prev) => keep_first(&mut self.cx, prev, row),
            });
        }
        (next == at + count).then(|| self.update_check_acc(first, results))
    }

    /// With checks (`first`: their first failure), the device's check accumulator becomes an
    /// input and, updated, the program's last result. Whether there were checks.
    fn update_check_acc(&mut self, first: Option<Value>, results: &mut Vec<Value>) -> bool {
        let Some(row) = first else { return false };
        // (Not aliased to its input: XLA would add a copy to update it in place.)
        let acc = self.feed(TensorType { elem: ElemType::I64, dims: vec![3] }, Feed::CheckAcc);
        results.push(keep_first(&mut self.cx, acc, row));
        true
    }

    /// The program's parameters in order: the builder's feeds, and the float scalars the
    /// lowering made into inputs.
    fn ordered_feeds(&mut self) -> Vec<Feed> {
        let feeds = &self.feeds;
        std::mem::take(&mut self.cx.feeds)
            .into_iter()
            .map(|f| match f {
                lowerings::Feed::External(tag) => feeds[tag as usize].clone(),
                lowerings::Feed::Scalar { slot, elem } => Feed::Scalar(slot, elem),
            })
            .collect()
    }
}

/// A written cell's old buffer is donated to its new one when their types match: in-place
/// updates (optimizer steps) then reuse the memory instead of holding two copies. The cell
/// holds the only reference to its buffer, and it is replaced by the output right after.
/// (Donation was off for a while as a suspect in a long-run segfault; the cause was the
/// unbounded executable cache, see max_executables.) Returns (parameter, result) aliases and
/// marks the donated specs.
fn donate_written_buffers(cx: &Cx, feeds: &[Feed], results: &[Value], specs: &mut [OutSpec]) -> Vec<(usize, usize)> {
    let mut aliases = Vec::new();
    for (r, spec) in specs.iter_mut().enumerate() {
        if let OutSpec::Base { slot, donated, .. } = spec {
            if let Some(p) = feeds.iter().position(|f| matches!(f, Feed::Base(s) if s == slot)) {
                if cx.b.ty(cx.b.param_value(p)) == cx.b.ty(results[r]) {
                    aliases.push((p, r));
                    *donated = true;
                }
            }
        }
    }
    aliases
}

/// Compiles the program's text (or loads it from the persistent cache); compiled graphs
/// tier as graphs whatever the tiering asked (runtime::Tiering::Graph). In fused eager mode it compiles on a
/// worker thread (compile_pool.rs), or waits for its graph's run where new graphs may compile
/// as one program (fused::fuse_new_graphs): the call is recorded, not run, and the graph's run
/// waits for the program; where `background` asks, it compiles on a worker thread ahead of
/// need. Also says whether the program takes the quick tier for good.
fn compile_program(info: &OpInfo, text: String, tiering: Tiering, background: bool) -> Result<(Arc<Program>, bool), Error> {
    let rt = runtime()?;
    let tiering = if info.qualified.starts_with("torchtpu::run_graph") { Tiering::Graph } else { tiering };
    let first = crate::runtime::first_build(&text, tiering);
    let quick = first == FirstBuild::Quick;
    // A user's kernel compiles at its call even in fused eager mode: its text is the user's
    // (a compile error is a usage error, raised at the call).
    let users_text = info.qualified == "torchtpu::stablehlo_kernel";
    // Needed now but large, looping or a graph: the quick tier first, the full tier after some
    // runs.
    let quick_first = first == FirstBuild::QuickThenFull && !background && !users_text;
    let text: Arc<str> = text.into();
    // A program's first build at `tiering`, or (None) its tier-up's at the full tier.
    let compiler = |tiering: Option<Tiering>| {
        let (qualified, base, text) = (info.qualified.clone(), info.base.clone(), text.clone());
        move || {
            let exe = match tiering {
                Some(tiering) => rt.compile(&qualified, &text, tiering),
                None => rt.tier_up(&qualified, &text),
            };
            exe.map_err(|e| format!("torchtpu: compiling {base} failed: {}\n{text}", e.message))
        }
    };
    let compile = compiler(Some(if quick || quick_first { Tiering::Quick } else { Tiering::Full }));
    let program = if background {
        compile_pool::submit(Urgency::Ahead, compile)
    } else if fused::enabled() && !users_text && fused::fuse_new_graphs() {
        // Compiled when its graph runs op by op; a new graph may compile as one program
        // instead (fused.rs).
        compile_pool::deferred(compile)
    } else if fused::enabled() && !users_text {
        compile_pool::submit(Urgency::Needed, compile)
    } else {
        Program::compile_here(compile).map_err(Error::runtime)?
    };
    if quick_first {
        program.tier_up_to(compiler(None));
    }
    Ok((program, quick))
}

/// Compiles a user's serialized module (a kernel whose program is the module itself).
fn compile_module(info: &OpInfo, module: &[u8]) -> Result<Arc<Program>, Error> {
    let rt = runtime()?;
    Program::compile_here(|| rt.compile_code(&info.qualified, module)).map_err(|e| Error::runtime(format!("torchtpu: compiling a kernel module failed: {}", e.message)))
}

/// A device check's result [1 + member, position, value] as [failure id, position, value]
/// (id 0: passed).
fn failure_row(cx: &mut Cx, v: Value, ids: &[Value]) -> Value {
    let code = cx.b.slice(v, &[0], &[1], &[1]);
    let rest = cx.b.slice(v, &[1], &[3], &[1]);
    let mut id = cx.b.constant_i64(0, ElemType::I64);
    let id_dims = [1];
    id = cx.b.broadcast_in_dim(id, &id_dims, &[]);
    for (m, &h) in ids.iter().enumerate().rev() {
        let mc = cx.b.constant_i64(m as i64 + 1, ElemType::I64);
        let mc = cx.b.broadcast_in_dim(mc, &id_dims, &[]);
        let hit = cx.b.compare(stablehlo::CmpDir::Eq, code, mc);
        id = cx.b.select(hit, h, id);
    }
    cx.b.concatenate(&[id, rest], 0)
}

/// `prev` if it holds a failure, else `next` (both [failure id, position, value]).
fn keep_first(cx: &mut Cx, prev: Value, next: Value) -> Value {
    let id = cx.b.slice(prev, &[0], &[1], &[1]);
    let zero = cx.b.constant_i64(0, ElemType::I64);
    let zero = cx.b.broadcast_in_dim(zero, &[1], &[]);
    let failed = cx.b.compare(stablehlo::CmpDir::Ne, id, zero);
    let failed = cx.b.broadcast_in_dim(failed, &[3], &[0]);
    cx.b.select(failed, prev, next)
}

/// Whether the op takes CPU tensors next to tpu ones (declared `.host_tensors()`).
fn host_tensors_allowed(base: &str) -> bool {
    lowerings::registry().get(base).is_some_and(|d| d.host_tensors)
}
