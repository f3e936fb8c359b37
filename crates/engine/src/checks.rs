//! Data-dependent checks (out-of-range indices): PyTorch raises when a kernel meets a bad index.
//! A lowering attaches checks to its program (`lowerings::Check`); the engine runs them:
//! - on index tensors fed from host memory, before the program runs: the call raises exactly
//!   like PyTorch;
//! - otherwise on the device, without waiting for it. Each device keeps one small accumulator
//!   (int64 [3]: failure id, position, value of the first failure since the last
//!   synchronization); a program with checks takes it as an input and returns it updated, so
//!   nothing is read back per op and nothing piles up. Every host synchronization (a read to
//!   the host, `torch.tpu.synchronize`, a data-dependent size) reads and resets it: the first
//!   failure raises there, as CUDA reports device-side errors. Programs without checks never
//!   touch it.
//!
//! A failure id is a hash of (exception class, message, op), so that a program's text (and
//! the persistent executable cache) is the same in every process; the process's table of ids
//! is filled as programs are built.
use crate::abi::TtArg;
use crate::cell::DevBuf;
use crate::error::Error;
use crate::runtime::runtime;
use crate::values::element_type;
use lowerings::{DType, ErrorKind, TorchError};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// What a failure id stands for.
#[derive(Debug)]
struct Failure {
    kind: ErrorKind,
    message: String,
    op: String,
}

static FAILURES: Mutex<Option<HashMap<i64, Failure>>> = Mutex::new(None);

/// The failure id of a check member (never 0, which means "no failure").
pub fn failure_id(kind: ErrorKind, message: &str, op: &str) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let kind_code = [kind as u8];
    for part in [&kind_code[..], message.as_bytes(), &[0xff], op.as_bytes()] {
        for &b in part {
            h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
    let id = if h == 0 { 1 } else { h as i64 };
    let mut t = FAILURES.lock().unwrap_or_else(|e| e.into_inner());
    t.get_or_insert_with(HashMap::new).entry(id).or_insert_with(|| Failure { kind, message: message.to_string(), op: op.to_string() });
    id
}

/// A check of index tensors fed from host memory.
#[derive(Debug)]
pub struct HostCheck {
    pub kind: ErrorKind,
    pub messages: Vec<String>,
    /// (argument, list item or -1, dims, lo, hi) of each member.
    pub members: Vec<(u32, i32, Vec<i64>, i64, i64)>,
    pub shape: Vec<i64>,
}

/// The failure text: the first `{value}` and `{position}` filled in.
fn message(template: &str, position: i64, value: i64) -> String {
    template.replacen("{value}", &value.to_string(), 1).replacen("{position}", &position.to_string(), 1)
}

fn host_value(bytes: *const u8, dtype: DType, i: usize) -> i64 {
    unsafe {
        match dtype {
            DType::I64 => (bytes as *const i64).add(i).read_unaligned(),
            DType::I32 => (bytes as *const i32).add(i).read_unaligned() as i64,
            DType::I16 => (bytes as *const i16).add(i).read_unaligned() as i64,
            DType::I8 => *(bytes as *const i8).add(i) as i64,
            DType::U8 | DType::Bool => *bytes.add(i) as i64,
            DType::U16 => (bytes as *const u16).add(i).read_unaligned() as i64,
            DType::U32 => (bytes as *const u32).add(i).read_unaligned() as i64,
            DType::U64 => (bytes as *const u64).add(i).read_unaligned() as i64,
            _ => 0,
        }
    }
}

/// Runs a host check on the call's arguments: the first failing element (row-major in the
/// broadcast shape), and there the first failing member.
pub fn run_host(check: &HostCheck, args: &[TtArg]) -> Result<(), Error> {
    let rank = check.shape.len();
    // Each member's row-major strides in the broadcast shape (0 where it broadcasts).
    let mut members = Vec::with_capacity(check.members.len());
    for &(arg, item, ref dims, lo, hi) in &check.members {
        let a = &args[arg as usize];
        let t = if item < 0 { a.tensor() } else { a.list::<TtArg>()[item as usize].tensor() };
        let dtype = DType::from_code(t.dtype).ok_or_else(|| Error::runtime("torchtpu: an index tensor of an unsupported dtype"))?;
        let mut strides = vec![0i64; rank];
        let mut s = 1;
        for (j, &d) in dims.iter().enumerate().rev() {
            let at = rank - dims.len() + j;
            if d != 1 {
                strides[at] = s;
            }
            s *= d;
        }
        members.push((t.host as *const u8, dtype, strides, lo, hi));
    }
    let n: i64 = check.shape.iter().product();
    if let [(ptr, dtype, _, lo, hi)] = &members[..] {
        if check.members[0].2 == check.shape {
            // One index tensor, not broadcast: a plain scan.
            for e in 0..n as usize {
                let v = host_value(*ptr, *dtype, e);
                if v < *lo || v >= *hi {
                    return Err(Error::Torch(TorchError::new(check.kind, message(&check.messages[0], e as i64, v))));
                }
            }
            return Ok(());
        }
    }
    let mut coord = vec![0i64; rank];
    for e in 0..n {
        for (m, (ptr, dtype, strides, lo, hi)) in members.iter().enumerate() {
            let off: i64 = coord.iter().zip(strides).map(|(c, s)| c * s).sum();
            let v = host_value(*ptr, *dtype, off as usize);
            if v < *lo || v >= *hi {
                return Err(Error::Torch(TorchError::new(check.kind, message(&check.messages[m], e, v))));
            }
        }
        for d in (0..rank).rev() {
            coord[d] += 1;
            if coord[d] < check.shape[d] {
                break;
            }
            coord[d] = 0;
        }
    }
    Ok(())
}

/// The accumulator of each device (None: nothing ran since the last synchronization).
static ACC: Mutex<Vec<Option<pjrt::Buffer>>> = Mutex::new(Vec::new());
/// Whether an accumulator may be set: synchronizations skip the lock when none is.
static ANY: AtomicBool = AtomicBool::new(false);

/// A device's accumulator, held (locked) while a program that updates it is enqueued.
pub struct Acc {
    guard: MutexGuard<'static, Vec<Option<pjrt::Buffer>>>,
    device: usize,
    cur: Option<pjrt::Buffer>,
}

/// Takes `device`'s accumulator (zeros when none is pending) until `Acc::store`.
pub fn acc(device: i32) -> Result<Acc, Error> {
    let mut guard = ACC.lock().unwrap_or_else(|e| e.into_inner());
    let d = device.max(0) as usize;
    if guard.len() <= d {
        guard.resize_with(d + 1, || None);
    }
    let cur = match guard[d].take() {
        Some(b) => b,
        None => {
            let rt = runtime()?;
            let ty = element_type(DType::I64);
            rt.client.buffer_from_host(&[0u8; 24], ty, &[3], None, rt.device(device)?)?
        }
    };
    Ok(Acc { guard, device: d, cur: Some(cur) })
}

impl Acc {
    /// The accumulator to feed the program.
    pub fn input(&self) -> &pjrt::Buffer {
        self.cur.as_ref().unwrap()
    }

    /// Keeps the program's updated accumulator.
    pub fn store(mut self, new: pjrt::Buffer) {
        self.guard[self.device] = Some(new);
        self.cur = None;
        ANY.store(true, Ordering::Release);
    }
}

impl Drop for Acc {
    fn drop(&mut self) {
        // The program did not run: the accumulator stays as it was.
        if let Some(cur) = self.cur.take() {
            self.guard[self.device] = Some(cur);
            ANY.store(true, Ordering::Release);
        }
    }
}

/// The accumulators of fused eager graphs that ran (fused.rs: a graph's checked ops update
/// an accumulator of its own), checked after the devices' own.
static GRAPH_ACCS: Mutex<Vec<Arc<DevBuf>>> = Mutex::new(Vec::new());

/// Keeps a fused eager graph's accumulator until the next synchronization.
pub fn keep_graph_acc(acc: Arc<DevBuf>) {
    GRAPH_ACCS.lock().unwrap_or_else(|e| e.into_inner()).push(acc);
    ANY.store(true, Ordering::Release);
}

/// Reads every device's accumulator (waiting for the programs that update it) and resets
/// it; the first failure is returned as its error.
pub fn raise_pending() -> Result<(), Error> {
    if !ANY.load(Ordering::Acquire) {
        return Ok(());
    }
    let (accs, graph_accs): (Vec<pjrt::Buffer>, Vec<Arc<DevBuf>>) = {
        let mut g = ACC.lock().unwrap_or_else(|e| e.into_inner());
        ANY.store(false, Ordering::Release);
        let graphs = std::mem::take(&mut *GRAPH_ACCS.lock().unwrap_or_else(|e| e.into_inner()));
        (g.iter_mut().filter_map(Option::take).collect(), graphs)
    };
    for buf in accs.iter().chain(graph_accs.iter().map(|b| &b.buf)) {
        let mut bytes = [0u8; 24];
        buf.to_host(&mut bytes)?;
        let word = |j: usize| i64::from_le_bytes(bytes[j * 8..j * 8 + 8].try_into().unwrap());
        let id = word(0);
        if id == 0 {
            continue;
        }
        let t = FAILURES.lock().unwrap_or_else(|e| e.into_inner());
        let Some(f) = t.as_ref().and_then(|t| t.get(&id)) else {
            return Err(Error::runtime(format!("torchtpu: a device-side check failed (unknown failure id {id})")));
        };
        let op = if f.op.starts_with("torchtpu::run_graph") { "a compiled graph" } else { &f.op };
        let at = if crate::blocking::enabled() {
            format!("raised at the op that failed ({op}): launch-blocking mode")
        } else {
            format!("from an earlier op ({op}), raised at this synchronization: tpu runs ops asynchronously, like CUDA; \
                     TORCHTPU_LAUNCH_BLOCKING=1 raises it at the op")
        };
        let text = format!("{}\n({at})", message(&f.message, word(1), word(2)));
        return Err(Error::Torch(TorchError::new(f.kind, text)));
    }
    Ok(())
}
