//! Recording a call into fused eager mode's graph (fused.rs) instead of running it: its inputs,
//! its uploads, and its results as pending cells.
use super::cache::{BucketCall, Entry, Feed, OutSpec};
use super::key::Scan;
use super::run::{returns_of, scalar_buffer, upload, upload_feed};
use super::{Engine, OpInfo, Produced};
use crate::abi::*;
use crate::cell::{Buf, Cell, DevBuf, Stored};
use crate::checks;
use crate::error::{not_computed, Error};
use crate::fused;
use crate::lock::Held;
use crate::runtime::runtime;
use lowerings::DType;
use std::sync::Arc;

/// Records the call into fused eager mode's graph instead of running it (fused.rs): its
/// inputs are the cells' buffers as they are now (or pending results of the graph) and its
/// uploads, made now; its results are pending cells.
pub(super) fn record(engine: &mut Engine, info: &OpInfo, entry: &Arc<Entry>, bucket: Option<&BucketCall>, args: &[TtArg], scan: &Scan, held: &mut Held) -> Result<Vec<Produced>, Error> {
    for c in &entry.host_checks {
        checks::run_host(c, args)?;
    }
    let device = scan.device;
    let graph = engine.fused.graph(device)?;
    let mut inputs = Vec::with_capacity(entry.feeds.len());
    for f in &entry.feeds {
        let input = match *f {
            Feed::Base(slot) => {
                // SAFETY: the call's arguments keep their cells alive.
                let cell = unsafe { &*scan.cells[slot as usize] };
                let s = cell.get(held).as_ref().expect("a fed cell holds a buffer");
                match (&s.buf, s.dev()) {
                    (_, Some(b)) => fused::Input::Ready(b.clone()),
                    (Buf::Pending(p), None) => graph.input_of(p).ok_or_else(not_computed)?,
                    (Buf::Ready(_), None) => unreachable!("a ready buffer is computed"),
                }
            }
            // The graph's own check accumulator: the last checked op's, or zeros.
            Feed::CheckAcc => match &graph.acc {
                Some(p) => graph.input_of(p).expect("a graph's accumulator is its own result"),
                None => fused::Input::Owned(upload(runtime()?, &[0u8; 24], DType::I64, &[3], device)?),
            },
            Feed::Scalar(n, elem) => fused::Input::Scalar(scalar_buffer(scan, n, elem)?),
            _ => fused::Input::Owned(upload_feed(f, bucket, false, args, scan)?.expect("a recorded call's feeds are cells or uploads")),
        };
        inputs.push(input);
    }
    let mut made: Vec<Option<Produced>> = Vec::with_capacity(entry.results.len());
    let mut outs = Vec::with_capacity(entry.results.len());
    for (i, spec) in entry.results.iter().enumerate() {
        let pending = graph.pending(i);
        let (dtype, dims) = match spec {
            OutSpec::New { dtype, dims } | OutSpec::Base { dtype, dims, .. } => (*dtype, dims.clone()),
        };
        let stored = Stored { buf: Buf::Pending(pending.clone()), dtype, dims: dims.clone(), constant: false };
        match spec {
            OutSpec::New { .. } => {
                let shown = bucket.map_or(&dims, |s| &s.dims[i]).clone();
                let nbytes = shown.iter().product::<i64>() * dtype.size() as i64;
                let constant = |c: &[Option<[u8; 8]>]| c.get(i).copied().flatten();
                let stored = match constant(&entry.constants).or_else(|| bucket.and_then(|b| constant(&b.constants))) {
                    Some(bytes) => {
                        // One element: a 0-d result, or its bucketed program's [1].
                        let n = dtype.size();
                        let buf = DevBuf::new(upload(runtime()?, &bytes[..n], dtype, &dims, device)?, n as i64, device);
                        Stored { constant: true, ..Stored::ready(buf, dtype, dims.clone()) }
                    }
                    None => stored,
                };
                made.push(Some(Produced::Tensor { cell: Cell::new(nbytes, device, Some(stored)), dtype, dims: shown }));
            }
            OutSpec::Base { slot, .. } => {
                // SAFETY: the call's arguments keep their cells alive.
                unsafe { &*scan.cells[*slot as usize] }.set(held, Some(stored));
                made.push(None);
            }
        }
        outs.push((pending, dtype, dims));
    }
    if entry.checks {
        // Its updated accumulator, the program's last result.
        let acc = graph.pending(outs.len());
        graph.acc = Some(acc.clone());
        outs.push((acc, DType::I64, vec![3]));
    }
    engine.fused.push(fused::Op { name: info.base.clone(), entry: entry.clone(), inputs, outs }, engine.tick);
    Ok(returns_of(entry, made))
}
