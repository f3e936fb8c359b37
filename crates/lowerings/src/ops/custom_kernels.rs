//! Users' own kernels as ops: `torchtpu::stablehlo_kernel(int kernel, Tensor[] inputs)`.
//! A kernel is registered once (`register_text`, `register_module`) and called by its id:
//! - StableHLO text: its functions join the calling program (renamed apart, private), and the
//!   call is a `func.call` of its @main, so it also fuses into compiled graphs;
//! - a serialized module (MLIR bytecode, as jax.export writes it): the program is that module
//!   itself (`Cx::module_override`); the values made here only declare its signature.
use crate::args::Args;
use crate::cx::Cx;
use crate::dtype::DType;
use crate::error::Result;
use crate::{bail, check, op, Op, Out};
use stablehlo::{ElemType, TensorType};
use std::sync::{Arc, Mutex};

pub(crate) const OPS: &[Op] = &[op("torchtpu::stablehlo_kernel", stablehlo_kernel)];

pub enum Code {
    /// The kernel's functions, renamed and private; `main` is its entry's new name.
    Text { functions: String, main: String },
    Module(Arc<Vec<u8>>),
}

pub struct Kernel {
    pub name: String,
    pub code: Code,
    pub params: Vec<TensorType>,
    pub results: Vec<TensorType>,
}

static KERNELS: Mutex<Vec<Arc<Kernel>>> = Mutex::new(Vec::new());

/// Adds the kernel `make(id)` under the next id (the lock held: ids name renamed functions).
fn add(make: impl FnOnce(usize) -> Result<Kernel>) -> Result<i64> {
    let mut ks = KERNELS.lock().unwrap();
    let id = ks.len();
    ks.push(Arc::new(make(id)?));
    Ok(id as i64)
}

/// The registered kernel `id`.
pub fn kernel(id: i64) -> Result<Arc<Kernel>> {
    match KERNELS.lock().unwrap().get(id as usize) {
        Some(k) => Ok(k.clone()),
        None => bail!(Runtime, "torchtpu: unknown kernel id {}", id),
    }
}

/// Registers StableHLO text (a module, or bare functions) whose `@main` is the kernel; the
/// error says what is wrong with the text. Returns the kernel's id.
pub fn register_text(name: &str, text: &str) -> Result<i64> {
    let body = strip_module(text);
    let defined = defined_functions(body);
    check!(defined.iter().any(|f| f == "main"), Value, "{}: the StableHLO text has no func.func @main", name);
    let (params, results) = signature(name, body, "main")?;
    add(|id| {
        // Rename every function apart (they join other programs) and make it private.
        let prefix = format!("tt_kernel{id}_");
        let mut functions = rename_symbols(body, &defined, &prefix);
        for vis in ["func.func public @", "func.func private @"] {
            functions = functions.replace(vis, "func.func @");
        }
        functions = functions.replace("func.func @", "func.func private @");
        Ok(Kernel { name: name.to_string(), code: Code::Text { functions, main: format!("{prefix}main") }, params, results })
    })
}

/// Registers a serialized module (MLIR bytecode or text) whose @main takes `params` and
/// returns `results` (the caller read them from the module's container). Returns its id.
pub fn register_module(name: &str, module: Vec<u8>, params: Vec<TensorType>, results: Vec<TensorType>) -> i64 {
    add(|_| Ok(Kernel { name: name.to_string(), code: Code::Module(Arc::new(module)), params, results })).expect("infallible")
}

/// The text inside `module ... { ... }`, or the text itself when it is bare functions.
fn strip_module(text: &str) -> &str {
    let t = text.trim();
    if t.starts_with("module") {
        if let (Some(open), Some(close)) = (t.find('{'), t.rfind('}')) {
            if open < close {
                return &t[open + 1..close];
            }
        }
    }
    t
}

fn is_symbol_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '$' | '-')
}

/// The functions the text defines (`func.func [public|private] @name`): (name, the text from
/// its `@`).
fn definitions(text: &str) -> Vec<(String, &str)> {
    let mut found = Vec::new();
    for (at, _) in text.match_indices("func.func") {
        let rest = text[at + "func.func".len()..].trim_start();
        let rest = rest.strip_prefix("public").or_else(|| rest.strip_prefix("private")).unwrap_or(rest).trim_start();
        if let Some(sym) = rest.strip_prefix('@') {
            found.push((sym.chars().take_while(|&c| is_symbol_char(c)).collect(), &rest[..]));
        }
    }
    found
}

/// The names of the functions the text defines.
fn defined_functions(text: &str) -> Vec<String> {
    definitions(text).into_iter().map(|(name, _)| name).collect()
}

/// Every `@name` of a defined function, definitions and references, as `@{prefix}name`.
fn rename_symbols(text: &str, defined: &[String], prefix: &str) -> String {
    let mut out = String::with_capacity(text.len() + 64);
    let mut rest = text;
    while let Some(at) = rest.find('@') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let sym: String = after.chars().take_while(|&c| is_symbol_char(c)).collect();
        if defined.contains(&sym) {
            out.push('@');
            out.push_str(prefix);
        } else {
            out.push('@');
        }
        out.push_str(&sym);
        rest = &after[sym.len()..];
    }
    out.push_str(rest);
    out
}

/// Parameter and result types of function `func` in `text` (which defines it).
fn signature(name: &str, text: &str, func: &str) -> Result<(Vec<TensorType>, Vec<TensorType>)> {
    let Some((_, header)) = definitions(text).into_iter().find(|(n, _)| n == func) else {
        bail!(Value, "{}: the StableHLO text has no func.func @{}", name, func);
    };
    let body_open = header.find('{').unwrap_or(header.len());
    // Attributes of arguments and results hold braces too: the header ends at the brace after
    // the result list's closing parenthesis or type.
    let header = signature_header(header).unwrap_or(&header[..body_open]);
    let (args, results) = match header.find("->") {
        Some(arrow) => (&header[..arrow], &header[arrow + 2..]),
        None => (header, ""),
    };
    let params = tensor_types(name, args)?;
    let results = tensor_types(name, results)?;
    Ok((params, results))
}

/// `@main(...) -> (...)` up to the opening brace of the body, skipping braces nested in
/// parentheses (argument and result attributes).
fn signature_header(header: &str) -> Option<&str> {
    let mut depth = 0i32;
    let mut angle = 0i32;
    for (i, c) in header.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            '<' => angle += 1,
            '>' if !header[..i].ends_with('-') => angle -= 1,
            '{' if depth == 0 && angle == 0 => {
                // `-> tensor<..> {jax.result_info = ...}` has result attributes only inside
                // parentheses; a bare brace after the results opens the body.
                return Some(&header[..i]);
            }
            _ => {}
        }
    }
    None
}

/// The `tensor<...>` types in a piece of a signature, in order.
fn tensor_types(name: &str, text: &str) -> Result<Vec<TensorType>> {
    let mut out = Vec::new();
    for part in text.split("tensor<").skip(1) {
        let mut depth = 1;
        let end = part
            .char_indices()
            .find(|&(_, c)| {
                match c {
                    '<' => depth += 1,
                    '>' => depth -= 1,
                    _ => {}
                }
                depth == 0
            })
            .map(|(i, _)| i)
            .unwrap_or(part.len());
        out.push(tensor_type(name, &part[..end])?);
    }
    Ok(out)
}

/// "4x8xf32" (or "f32" for 0-d) as a tensor type.
fn tensor_type(name: &str, t: &str) -> Result<TensorType> {
    let t = t.split(',').next().unwrap_or(t).trim(); // drop an encoding (sharding, layout)
    let mut dims = Vec::new();
    let mut rest = t;
    loop {
        let Some(x) = rest.find('x') else { break };
        let d = &rest[..x];
        if d.is_empty() || !d.chars().all(|c| c.is_ascii_digit() || c == '?') {
            break;
        }
        check!(d != "?", NotImplemented, "{}: kernels with dynamic dimensions (tensor<{}>) are not supported", name, t);
        dims.push(d.parse::<i64>().map_err(|_| crate::error::TorchError::new(crate::ErrorKind::Value, format!("{name}: bad type tensor<{t}>")))?);
        rest = &rest[x + 1..];
    }
    let elem = match rest {
        "i1" => ElemType::Pred,
        "i8" => ElemType::I8,
        "i16" => ElemType::I16,
        "i32" => ElemType::I32,
        "i64" => ElemType::I64,
        "ui8" => ElemType::U8,
        "ui16" => ElemType::U16,
        "ui32" => ElemType::U32,
        "ui64" => ElemType::U64,
        "f16" => ElemType::F16,
        "bf16" => ElemType::BF16,
        "f32" => ElemType::F32,
        "f64" => ElemType::F64,
        "complex<f32>" => ElemType::C64,
        "complex<f64>" => ElemType::C128,
        "f8E4M3FN" => ElemType::F8E4M3FN,
        "f8E5M2" => ElemType::F8E5M2,
        "f8E4M3FNUZ" => ElemType::F8E4M3FNUZ,
        "f8E5M2FNUZ" => ElemType::F8E5M2FNUZ,
        "f8E8M0FNU" => ElemType::F8E8M0FNU,
        other => bail!(NotImplemented, "{}: element type {} (in tensor<{}>) has no torch dtype", name, other, t),
    };
    Ok(TensorType { elem, dims })
}

fn type_str(t: &TensorType) -> String {
    format!("{} {}", DType::from_elem(t.elem).python_name(), crate::blocks::type_names::shape_str(&t.dims))
}

/// (kernel, inputs) -> the kernel's results.
fn stablehlo_kernel(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let k = kernel(args.int("kernel")?)?;
    let inputs = args.tensors("inputs")?;
    check!(
        inputs.len() == k.params.len(),
        Runtime,
        "{}: the kernel takes {} inputs, got {}",
        k.name,
        k.params.len(),
        inputs.len()
    );
    for (i, (t, p)) in inputs.iter().zip(&k.params).enumerate() {
        let got = TensorType { elem: t.dtype.elem(), dims: cx.dims(t.v) };
        check!(&got == p, Runtime, "{}: input {} is {}, but the kernel takes {}", k.name, i, type_str(&got), type_str(p));
    }
    let values: Vec<_> = inputs.iter().map(|t| t.v).collect();
    let outs = match &k.code {
        Code::Text { functions, main } => cx.b.call(main, functions, &values, &k.results),
        Code::Module(module) => {
            // The program is the module: its results are declared here by placeholders.
            check!(cx.module_override.is_none(), Runtime, "{}: a serialized kernel runs as a program of its own", k.name);
            cx.module_override = Some(module.clone());
            k.results.iter().map(|t| cx.full(0.0, DType::from_elem(t.elem), &t.dims)).collect()
        }
    };
    Ok(vec![Out::List(outs)])
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"module @jit_f attributes {mhlo.num_partitions = 1 : i32} {
  func.func public @main(%arg0: tensor<4x8xf32> loc("x"), %arg1: tensor<i32>) -> (tensor<4x8xf32> {jax.result_info = "result"}) {
    %0 = call @helper(%arg0) : (tensor<4x8xf32>) -> tensor<4x8xf32>
    return %0 : tensor<4x8xf32>
  }
  func.func private @helper(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
    return %x : tensor<4x8xf32>
  }
}"#;

    #[test]
    fn text_kernels_are_renamed_apart_and_typed() {
        let id = register_text("test::k", TEXT).unwrap();
        let k = kernel(id).unwrap();
        assert_eq!(k.params, vec![TensorType::new(ElemType::F32, &[4, 8]), TensorType::new(ElemType::I32, &[])]);
        assert_eq!(k.results, vec![TensorType::new(ElemType::F32, &[4, 8])]);
        let Code::Text { functions, main } = &k.code else { panic!("a text kernel") };
        assert_eq!(main, &format!("tt_kernel{id}_main"));
        assert!(functions.contains(&format!("func.func private @tt_kernel{id}_main(")));
        assert!(functions.contains(&format!("call @tt_kernel{id}_helper(")));
        assert!(!functions.contains("module"));
    }

    #[test]
    fn the_signature_is_read_from_the_definition() {
        let text = "// @main(%x: tensor<1xi8>) is below\nfunc.func @main(%x: tensor<3xbf16>) -> tensor<3xbf16> {\n  return %x : tensor<3xbf16>\n}";
        let k = kernel(register_text("test::sig", text).unwrap()).unwrap();
        assert_eq!(k.params, vec![TensorType::new(ElemType::BF16, &[3])]);
    }

    #[test]
    fn bad_text_says_why() {
        let e = register_text("test::bad", "func.func @f(%x: tensor<2xf32>) -> tensor<2xf32> { return %x : tensor<2xf32> }");
        assert!(e.unwrap_err().message.contains("no func.func @main"));
        let e = register_text("test::dyn", "func.func @main(%x: tensor<?xf32>) -> tensor<?xf32> { return %x : tensor<?xf32> }");
        assert!(e.unwrap_err().message.contains("dynamic dimensions"));
    }
}
