//! Finding a call's executable in the cache by its key: a hit (and the promotion of a shape a
//! bucketed program serves to its own program), a bucketed program, or a new build.
use super::build::{build, build_bucketed, dry_run, Built, Dry, Sizing};
use super::cache::{bound_cache, BucketCall, Cached, Entry, Promotion};
use super::key::{bucket_key_arg, Scan, BUCKET_PROGRAM};
use super::{Engine, OpInfo};
use crate::abi::*;
use crate::buckets;
use crate::cell::Cell;
use crate::error::Error;
use crate::fused;
use crate::lock::Held;
use crate::overlap;
use std::sync::Arc;
use std::time::Instant;

pub(super) enum Looked {
    Entry(Arc<Entry>, Option<Arc<BucketCall>>),
    Resize(usize, Vec<i64>),
}

#[allow(clippy::too_many_arguments)]
pub(super) fn lookup(
    engine: &mut Engine,
    held: &Held,
    key: &[u64],
    info: &OpInfo,
    f: lowerings::LowerFn,
    specialize: bool,
    args: &[TtArg],
    scan: &Scan,
    sizing: Sizing,
) -> Result<Looked, Error> {
    engine.tick += 1;
    let tick = engine.tick;
    if let Some(c) = engine.cache.get_mut(key) {
        c.used = tick;
        engine.stats.hits += 1;
        c.runs = c.runs.saturating_add(1);
        // A shape a bucketed program keeps serving gets its own exact program: compiled on a
        // worker thread meanwhile, it takes over at a fixed call (the two may round differently
        // in the last place, and a script run twice must give the same numbers).
        let (due, takes_over) = if fused::enabled() {
            // By graphs in a row: a fused program is composed of its ops' programs, and its
            // structure must stop changing for it to be fused (fused.rs).
            let graph = engine.fused.next_generation();
            let first_in_graph = graph != c.last_graph;
            if first_in_graph {
                c.graphs = if graph - c.last_graph <= buckets::RECENT_GRAPHS { c.graphs + 1 } else { 1 };
                c.last_graph = graph;
            }
            (first_in_graph && c.graphs == buckets::PROMOTE_GRAPHS, c.graphs > buckets::PROMOTE_GRAPHS)
        } else {
            (c.runs == buckets::PROMOTE_AFTER + 1, c.runs > buckets::PROMOTE_AFTER + buckets::PROMOTE_CALLS)
        };
        if let (true, Promotion::Compiling(exact)) = (takes_over, &c.promotion) {
            c.entry = exact.clone();
            c.promotion = Promotion::Done;
        }
        let looked = Looked::Entry(c.entry.clone(), c.bucket.clone());
        if c.bucket.is_some() && due && matches!(c.promotion, Promotion::NotYet) && !buckets::scoped() {
            let t0 = Instant::now();
            if let Ok(Built::Entry(exact)) = build(info, f, specialize, args, scan, held, sizing, true) {
                engine.stats.bucket_promoted += 1;
                engine.stats.misses += 1;
                engine.stats.compile_seconds += t0.elapsed().as_secs_f64();
                engine.cache.get_mut(key).expect("the entry just used").promotion = Promotion::Compiling(Arc::new(exact));
            }
        }
        return Ok(looked);
    }
    // A key fixes the written views' geometry and which cells they share: checked once per key.
    overlap::check(&info.base, args, &info.write_args)?;
    if matches!(sizing, Sizing::None) && bucketed_here(info) {
        if let Some(looked) = lookup_bucketed(engine, held, key, info, f, specialize, args, scan)? {
            return Ok(looked);
        }
    }
    let t0 = Instant::now();
    let entry = match build(info, f, specialize, args, scan, held, sizing, false)? {
        Built::Entry(e) => Arc::new(e),
        Built::Resize(i, dims) => return Ok(Looked::Resize(i, dims)),
    };
    engine.stats.misses += 1;
    engine.stats.compile_seconds += t0.elapsed().as_secs_f64();
    bound_cache(engine);
    engine.cache.insert(key.to_vec().into_boxed_slice(), Cached { entry: entry.clone(), bucket: None, promotion: Promotion::NotYet, used: tick, runs: 0, graphs: 1, last_graph: engine.fused.next_generation() });
    Ok(Looked::Entry(entry, None))
}

/// A call of a bucketable op at a shape not seen yet: served by the bucketed program of its
/// sizes' buckets once its family has compiled `buckets::EXACT_SHAPES_FIRST` exact shapes
/// (compiling that program on its first use). None: compile this shape exactly.
#[allow(clippy::too_many_arguments)]
fn lookup_bucketed(
    engine: &mut Engine,
    held: &Held,
    key: &[u64],
    info: &OpInfo,
    f: lowerings::LowerFn,
    specialize: bool,
    args: &[TtArg],
    scan: &Scan,
) -> Result<Option<Looked>, Error> {
    let base_dtype = |t: &TtTensor| {
        // SAFETY: the call's arguments keep their cells alive.
        let cell = unsafe { &*(t.cell as *const Cell) };
        // A cell not written yet reads as zeros of any dtype.
        cell.get(held).as_ref().map_or(Some(t.dtype), |s| Some(s.dtype as i8))
    };
    if !buckets::servable(args, base_dtype, &info.write_args) {
        return Ok(None);
    }
    // Filling storage not written yet from nothing as large as itself (zeros_like's zero_, an
    // initializer's normal_ on empty) runs exactly: a bucketed fill would give the storage a
    // buffer of its bucket for life (optimizer state, parameters: up to twice the memory, and
    // every later fused step slicing the values out and updating them back in). A copy into
    // a new tensor keeps its bucket (a cache grown by copies compiles per bucket), and so does
    // every write in a `bucketed_programs()` scope (a server's step buffers, new at each size).
    let numel = |t: &TtTensor| t.sizes().iter().product::<i64>();
    let fills_new_storage = |i: &usize| {
        let Some(a) = args.get(*i).filter(|a| a.kind == TT_TENSOR) else { return false };
        let t = a.tensor();
        // SAFETY: the call's arguments keep their cells alive.
        let unwritten = unsafe { &*(t.cell as *const Cell) }.get(held).is_none();
        let others: i64 = args.iter().enumerate().filter(|(j, b)| j != i && b.kind == TT_TENSOR).map(|(_, b)| numel(b.tensor())).sum();
        unwritten && others < numel(t)
    };
    if !buckets::scoped() && info.write_args.iter().any(fills_new_storage) {
        return Ok(None);
    }
    // The family: the op, its arguments' kinds, dtypes, ranks and non-tensor values.
    let mut family = vec![BUCKET_PROGRAM, key[0]];
    for a in args {
        bucket_key_arg(&mut family, a, specialize, scan, held, true);
    }
    let seen = engine.families.entry(family.into_boxed_slice()).or_insert(0);
    if *seen < buckets::EXACT_SHAPES_FIRST && !buckets::scoped() {
        *seen += 1;
        return Ok(None);
    }
    // The program: the family with every tensor's sizes bucketed and its storage's dims (the
    // program's parameter); sizes, strides and offsets are its runtime geometry.
    let mut layout = vec![BUCKET_PROGRAM, key[0]];
    for a in args {
        bucket_key_arg(&mut layout, a, specialize, scan, held, false);
    }
    // The exact shapes' lowering, not compiled: PyTorch's errors, out= resizes, result sizes.
    let (dims, constants, failures) = match dry_run(info, f, specialize, args, scan, held)? {
        Dry::Resize(i, dims) => return Ok(Some(Looked::Resize(i, dims))),
        Dry::Exact => return Ok(None),
        Dry::Results(dims, constants, failures) => (dims, constants, failures),
    };
    let mut geometry = Vec::new();
    buckets::input_geometry(args, &mut geometry);
    // Each result's padded dims shape the program, and its capacity the buffer it fills: a cat
    // of inputs in the same buckets can have results in different ones.
    for d in &dims {
        layout.push(d.len() as u64);
        layout.extend(buckets::padded(d).iter().map(|&n| n as u64));
        layout.push(buckets::capacity(d) as u64);
        geometry.extend_from_slice(d);
    }
    layout.push(failures.len() as u64);
    geometry.extend_from_slice(&failures);
    engine.tick += 1;
    let tick = engine.tick;
    let entry = match engine.cache.get_mut(layout.as_slice()) {
        Some(c) => {
            c.used = tick;
            c.entry.clone()
        }
        None => {
            let t0 = Instant::now();
            let Some(e) = build_bucketed(info, f, specialize, args, scan, held, &geometry, &dims)? else {
                return Ok(None);
            };
            let e = Arc::new(e);
            engine.stats.misses += 1;
            engine.stats.bucket_programs += 1;
            engine.stats.compile_seconds += t0.elapsed().as_secs_f64();
            bound_cache(engine);
            engine.cache.insert(layout.into_boxed_slice(), Cached { entry: e.clone(), bucket: None, promotion: Promotion::NotYet, used: tick, runs: 0, graphs: 1, last_graph: engine.fused.next_generation() });
            e
        }
    };
    engine.stats.bucket_shapes += 1;
    let call = Arc::new(BucketCall { geometry, uploaded: std::sync::OnceLock::new(), dims, constants });
    engine.cache.insert(key.to_vec().into_boxed_slice(), Cached { entry: entry.clone(), bucket: Some(call.clone()), promotion: Promotion::NotYet, used: tick, runs: 0, graphs: 1, last_graph: engine.fused.next_generation() });
    Ok(Some(Looked::Entry(entry, Some(call))))
}

/// Whether bucketed programs can serve the op (declared `.pointwise()` or `.bucketed()`).
pub(super) fn bucketable(info: &OpInfo) -> bool {
    info.lowering.is_some_and(|l| l.pointwise || l.bucketed)
}

/// Whether this call may take a bucketed program: in a scope any bucketable op, elsewhere
/// (bucketed programs on) those not declared for scopes only.
fn bucketed_here(info: &OpInfo) -> bool {
    bucketable(info) && (buckets::scoped() || (buckets::enabled() && !info.lowering.is_some_and(|l| l.bucketed_in_scopes_only)))
}
