//! The argument names of every aten overload, read from PyTorch's dispatcher, for the lowerings'
//! check of argument reads (lowerings::args::check_argument_names): with TORCHTPU_CHECK_ARGS=1
//! (the tests set it) a lowering that reads a name none of its ops' overloads has raises.
use std::collections::{HashMap, HashSet};
use std::ffi::{c_char, c_void, CStr};
use std::sync::{Arc, Mutex, OnceLock};

type Visit = extern "C" fn(ctx: *mut c_void, name: *const c_char, args: *const *const c_char, n: usize);

extern "C" {
    fn tt_each_aten_schema(visit: Visit, ctx: *mut c_void);
}

fn asked() -> bool {
    std::env::var("TORCHTPU_CHECK_ARGS").is_ok_and(|v| v == "1")
}

/// Turns the check on when the environment asks for it.
pub fn install_if_asked() {
    if asked() {
        lowerings::args::check_argument_names(names_for);
    }
}

/// What the check allows the lowering of `op` to read (sorted), when the check is on.
pub fn names_if_checked(op: &str) -> Option<Vec<String>> {
    let mut names: Vec<String> = names_for(op)?.iter().cloned().collect();
    names.sort();
    asked().then_some(names)
}

extern "C" fn visit(ctx: *mut c_void, name: *const c_char, args: *const *const c_char, n: usize) {
    let by_base = unsafe { &mut *(ctx as *mut HashMap<String, HashSet<String>>) };
    let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
    let names = by_base.entry(lowerings::base_name(&name).to_string()).or_default();
    for i in 0..n {
        names.insert(unsafe { CStr::from_ptr(*args.add(i)) }.to_string_lossy().into_owned());
    }
}

/// Base name -> the argument names of every overload with that base name.
fn by_base() -> &'static HashMap<String, HashSet<String>> {
    static BY_BASE: OnceLock<HashMap<String, HashSet<String>>> = OnceLock::new();
    BY_BASE.get_or_init(|| {
        let mut map: HashMap<String, HashSet<String>> = HashMap::new();
        unsafe { tt_each_aten_schema(visit, &mut map as *mut _ as *mut c_void) };
        map
    })
}

/// The names the lowering of `op` may read: those of every op declared in the same family table
/// (a family's lowerings share helpers that read the names of their sibling ops, like
/// upsampling's align_corners). None for an op that is not an aten op with a lowering.
fn names_for(op: &str) -> Option<Arc<HashSet<String>>> {
    static CACHE: OnceLock<Mutex<HashMap<String, Option<Arc<HashSet<String>>>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(hit) = cache.lock().unwrap().get(op) {
        return hit.clone();
    }
    let registry = lowerings::registry();
    let mut names = HashSet::new();
    let mut any = false;
    for other in registry.family_names(op) {
        if let Some(known) = by_base().get(other) {
            names.extend(known.iter().cloned());
            any = true;
        }
    }
    let found = any.then(|| Arc::new(names));
    cache.lock().unwrap().insert(op.to_string(), found.clone());
    found
}
