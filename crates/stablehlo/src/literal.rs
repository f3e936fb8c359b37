//! Text of constant literals inside `dense<...>` attributes.
//!
//! Floats must survive the trip through MLIR's parser bit-exactly. MLIR reads a
//! decimal literal as an f64 and then rounds it once to the element type, so we
//! round the value into the element type here, widen it back to f64 (exact), and
//! print the shortest decimal that reads back as that f64. Values that have no
//! decimal form (inf, nan) are printed as the hex bit pattern, which MLIR
//! accepts for float element types.

use crate::types::ElemType;

/// Literal for one element of type `elem` holding the f64 `x`.
/// Ints truncate toward zero then wrap to the width; Pred is `x != 0`.
pub fn scalar_from_f64(x: f64, elem: ElemType) -> String {
    if elem.is_float() {
        float_literal(x, elem)
    } else if elem.is_complex() {
        complex_literal(x, 0.0, elem)
    } else if elem == ElemType::Pred {
        bool_literal(x != 0.0)
    } else {
        // `as i64` saturates and maps nan to 0: a defined answer for odd inputs.
        int_literal(x as i64, elem)
    }
}

/// Literal for one element of type `elem` holding the integer `x`.
pub fn scalar_from_i64(x: i64, elem: ElemType) -> String {
    if elem.is_float() || elem.is_complex() {
        scalar_from_f64(x as f64, elem)
    } else if elem == ElemType::Pred {
        bool_literal(x != 0)
    } else {
        int_literal(x, elem)
    }
}

pub fn bool_literal(b: bool) -> String {
    if b { "true" } else { "false" }.to_string()
}

/// `(re, im)` for complex element types.
pub fn complex_literal(re: f64, im: f64, elem: ElemType) -> String {
    let part = elem.real_type();
    format!("({}, {})", float_literal(re, part), float_literal(im, part))
}

/// Integer wrapped (two's complement) to the width of `elem`.
pub fn int_literal(x: i64, elem: ElemType) -> String {
    use ElemType::*;
    match elem {
        I8 => (x as i8).to_string(),
        I16 => (x as i16).to_string(),
        I32 => (x as i32).to_string(),
        I64 => x.to_string(),
        U8 | F4E2M1FNX2 => (x as u8).to_string(),
        U16 => (x as u16).to_string(),
        U32 => (x as u32).to_string(),
        U64 => (x as u64).to_string(),
        other => panic!("int_literal: {other} is not an integer type"),
    }
}

/// Float literal of `x` rounded (nearest-even) to `elem`.
pub fn float_literal(x: f64, elem: ElemType) -> String {
    let r = round_to(x, elem);
    if r.is_finite() {
        decimal(r)
    } else {
        special_hex(r, elem)
    }
}

/// Shortest decimal that reads back as exactly `x`, in MLIR's float-literal
/// grammar, which needs a `.` before any exponent (`1.0e-07`, not `1e-7`).
fn decimal(x: f64) -> String {
    let s = format!("{x:?}"); // Rust's Debug is shortest round-trip: "1.0", "1e-7", "-0.0"
    match s.find('e') {
        Some(i) if !s[..i].contains('.') => format!("{}.0{}", &s[..i], &s[i..]),
        _ => s,
    }
}

/// Hex bit pattern for inf/nan of `elem`.
fn special_hex(x: f64, elem: ElemType) -> String {
    use ElemType::*;
    let neg = x.is_sign_negative() && !x.is_nan();
    let (inf, nan, sign, digits): (u64, u64, u64, usize) = match elem {
        F64 => (0x7FF0_0000_0000_0000, 0x7FF8_0000_0000_0000, 1 << 63, 16),
        F32 => (0x7F80_0000, 0x7FC0_0000, 1 << 31, 8),
        F16 => (0x7C00, 0x7E00, 1 << 15, 4),
        BF16 => (0x7F80, 0x7FC0, 1 << 15, 4),
        F8E5M2 => (0x7C, 0x7E, 0x80, 2),
        // The formats without inf: round_to already mapped overflow to nan.
        F8E4M3FN => (0x7F, 0x7F, 0x80, 2),
        // FNUZ: the only nan is the "negative zero" pattern; no sign to set.
        F8E4M3FNUZ | F8E5M2FNUZ => (0x80, 0x80, 0, 2),
        F8E8M0FNU => (0xFF, 0xFF, 0, 2),
        other => panic!("special_hex: {other} is not a float type"),
    };
    let mut bits = if x.is_nan() { nan } else { inf };
    if neg {
        bits |= sign;
    }
    format!("0x{bits:0digits$X}")
}

/// Round `x` to the nearest value of float type `elem` (ties to even), returned as an f64
/// (exact), as PyTorch converts: overflow gives +-inf, or nan for the formats without inf;
/// FNUZ formats have no negative zero; E8M0 rounds the f32 value as c10's Float8_e8m0fnu.
pub fn round_to(x: f64, elem: ElemType) -> f64 {
    use ElemType::*;
    // (mantissa bits, exponent of the smallest normal, largest finite value)
    let (mant, emin, max) = match elem {
        F64 => return x,
        F32 => return x as f32 as f64,
        F8E8M0FNU => return e8m0_value(x),
        F16 => (10, -14, 65504.0),
        BF16 => (7, -126, 3.3895313892515355e38),
        F8E5M2 => (2, -14, 57344.0),
        F8E4M3FN => (3, -6, 448.0),
        F8E4M3FNUZ => (3, -7, 240.0),
        F8E5M2FNUZ => (2, -15, 57344.0),
        other => panic!("round_to: {other} is not a float type"),
    };
    let has_inf = matches!(elem, F16 | BF16 | F8E5M2);
    if !x.is_finite() {
        return if x.is_infinite() && !has_inf { f64::NAN } else { x };
    }
    let a = x.abs();
    // Binade of a (f64 exponent field), clamped at the subnormal range of elem.
    let e = (((a.to_bits() >> 52) & 0x7ff) as i32 - 1023).max(emin);
    let quantum = 2f64.powi(e - mant);
    let r = (a / quantum).round_ties_even() * quantum;
    let r = if r > max {
        if has_inf {
            f64::INFINITY
        } else {
            f64::NAN
        }
    } else {
        r
    };
    let unsigned_zero = matches!(elem, F8E4M3FNUZ | F8E5M2FNUZ) && r == 0.0;
    if x.is_sign_negative() && !unsigned_zero {
        -r
    } else {
        r
    }
}

/// The byte of the float8 value nearest `x` (as `round_to` rounds), for host-side scalars.
pub fn f8_bits(x: f64, elem: ElemType) -> u8 {
    let r = round_to(x, elem);
    (0..=255u8)
        .find(|&b| {
            let v = f8_value(b, elem);
            if r.is_nan() {
                v.is_nan()
            } else {
                v == r && v.is_sign_negative() == r.is_sign_negative()
            }
        })
        .expect("every float8 value has a byte")
}

/// The value of the float8 byte `b` of type `elem`.
fn f8_value(b: u8, elem: ElemType) -> f64 {
    use ElemType::*;
    if elem == F8E8M0FNU {
        return if b == 0xFF { f64::NAN } else { 2f64.powi(b as i32 - 127) };
    }
    // (exponent bits, exponent bias)
    let (ebits, bias) = match elem {
        F8E4M3FN => (4, 7),
        F8E5M2 => (5, 15),
        F8E4M3FNUZ => (4, 8),
        F8E5M2FNUZ => (5, 16),
        other => panic!("f8_value: {other} is not a float8 type"),
    };
    let mbits = 7 - ebits;
    let (sign, e, m) = (b >> 7, (b >> mbits) as i32 & ((1 << ebits) - 1), (b & ((1 << mbits) - 1)) as f64);
    let top = (1 << ebits) - 1;
    let special = match elem {
        F8E4M3FNUZ | F8E5M2FNUZ => (b == 0x80).then_some(f64::NAN),
        F8E4M3FN => (e == top && m == 7.0).then_some(f64::NAN),
        _ => (e == top).then_some(if m == 0.0 { f64::INFINITY } else { f64::NAN }),
    };
    let mag = special.unwrap_or_else(|| {
        let frac = m / (1 << mbits) as f64;
        if e == 0 {
            frac * 2f64.powi(1 - bias)
        } else {
            (1.0 + frac) * 2f64.powi(e - bias)
        }
    });
    if sign == 1 && !mag.is_nan() {
        -mag
    } else {
        mag
    }
}

/// c10's float -> Float8_e8m0fnu: the sign is dropped, the f32 exponent rounds up when the
/// mantissa's top bit is set (and something below it, or the value is normal), nan/inf and
/// overflow give nan.
fn e8m0_value(x: f64) -> f64 {
    let bits = (x as f32).to_bits();
    let exp = (bits >> 23) & 0xFF;
    if exp == 0xFF {
        return f64::NAN;
    }
    let guard = bits & 0x40_0000 != 0;
    let below = bits & 0x3F_FFFF != 0;
    let up = guard && (below || exp > 0);
    let biased = exp + up as u32;
    if biased == 0xFF {
        f64::NAN
    } else {
        2f64.powi(biased as i32 - 127)
    }
}

/// `dense<...>` body for the elements `xs` laid out row-major in `dims`:
/// `5` for 0-d, `[[1, 2], [3, 4]]` otherwise, and empty for zero elements.
pub fn dense_body(xs: &[String], dims: &[i64]) -> String {
    let n: i64 = dims.iter().product();
    assert_eq!(xs.len() as i64, n, "constant has {} values for dims {dims:?}", xs.len());
    if n == 0 {
        return String::new();
    }
    if dims.is_empty() {
        return xs[0].clone();
    }
    let mut out = String::new();
    nest(xs, dims, &mut out);
    out
}

fn nest(xs: &[String], dims: &[i64], out: &mut String) {
    out.push('[');
    if dims.len() == 1 {
        out.push_str(&xs.join(", "));
    } else {
        let chunk = xs.len() / dims[0] as usize;
        for (i, part) in xs.chunks(chunk).enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            nest(part, &dims[1..], out);
        }
    }
    out.push(']');
}

#[cfg(test)]
mod tests {
    use super::*;
    use ElemType::*;

    #[test]
    fn decimals_round_trip() {
        assert_eq!(float_literal(1.0, F32), "1.0");
        assert_eq!(float_literal(-0.0, F32), "-0.0");
        assert_eq!(float_literal(1e-7, F64), "1.0e-7");
        assert_eq!(float_literal(1.5e300, F64), "1.5e300");
        // 0.1 rounded to f32 then widened: exact digits of the f32 value.
        assert_eq!(float_literal(0.1, F32), "0.10000000149011612");
        assert_eq!(float_literal(0.1, BF16), "0.10009765625");
        assert_eq!(float_literal(1.0 / 3.0, F16), "0.333251953125");
    }

    #[test]
    fn specials_are_hex() {
        assert_eq!(float_literal(f64::INFINITY, F32), "0x7F800000");
        assert_eq!(float_literal(f64::NEG_INFINITY, F32), "0xFF800000");
        assert_eq!(float_literal(f64::NAN, F32), "0x7FC00000");
        assert_eq!(float_literal(f64::NAN, F64), "0x7FF8000000000000");
        assert_eq!(float_literal(f64::INFINITY, BF16), "0x7F80");
        assert_eq!(float_literal(-1e10, F16), "0xFC00"); // overflow
        assert_eq!(float_literal(1e40, F32), "0x7F800000");
        assert_eq!(float_literal(1e6, F8E4M3FN), "0x7F");
        assert_eq!(float_literal(f64::INFINITY, F8E5M2), "0x7C");
    }

    #[test]
    fn rounding_to_small_floats() {
        assert_eq!(round_to(65504.0, F16), 65504.0);
        assert_eq!(round_to(65519.0, F16), 65504.0); // below the halfway point
        assert!(round_to(65520.0, F16).is_infinite()); // tie rounds to even = overflow
        assert_eq!(round_to(1.0 + 1.0 / 256.0, BF16), 1.0); // tie to even
        assert_eq!(round_to(1.0 + 3.0 / 256.0, BF16), 1.0 + 4.0 / 256.0);
        assert_eq!(round_to(2f64.powi(-24), F16), 2f64.powi(-24)); // smallest subnormal
        assert_eq!(round_to(2f64.powi(-26), F16), 0.0);
        assert_eq!(round_to(464.0, F8E4M3FN), 448.0);
        assert_eq!(round_to(-0.3, F8E5M2), -0.3125);
        assert_eq!(round_to(245.0, F8E4M3FNUZ), 240.0);
        assert!(round_to(250.0, F8E4M3FNUZ).is_nan());
        assert!(round_to(1e6, F8E4M3FNUZ).is_nan());
        assert!(round_to(-0.0, F8E5M2FNUZ).is_sign_positive());
        assert_eq!(round_to(3.0, F8E8M0FNU), 4.0);
        assert_eq!(round_to(2.9, F8E8M0FNU), 2.0);
        assert_eq!(round_to(-1.0, F8E8M0FNU), 1.0);
        assert_eq!(round_to(0.0, F8E8M0FNU), 2f64.powi(-127));
        assert!(round_to(3e38, F8E8M0FNU).is_nan());
    }

    #[test]
    fn float8_bytes() {
        assert_eq!(f8_bits(1.0, F8E4M3FN), 0x38);
        assert_eq!(f8_bits(-448.0, F8E4M3FN), 0xFE);
        assert_eq!(f8_bits(f64::NAN, F8E4M3FN), 0x7F);
        assert_eq!(f8_bits(-0.0, F8E5M2), 0x80);
        assert_eq!(f8_bits(f64::NEG_INFINITY, F8E5M2), 0xFC);
        assert_eq!(f8_bits(0.3, F8E4M3FNUZ), 50);
        assert_eq!(f8_bits(1e6, F8E5M2FNUZ), 0x80);
        assert_eq!(f8_bits(-0.0, F8E5M2FNUZ), 0);
        assert_eq!(f8_bits(3.0, F8E8M0FNU), 129);
    }

    #[test]
    fn ints_wrap_and_truncate() {
        assert_eq!(scalar_from_i64(i64::MIN, I64), "-9223372036854775808");
        assert_eq!(scalar_from_i64(-1, U64), "18446744073709551615");
        assert_eq!(scalar_from_i64(300, I8), "44");
        assert_eq!(scalar_from_f64(-2.7, I32), "-2");
        assert_eq!(scalar_from_f64(0.5, Pred), "true");
        assert_eq!(scalar_from_i64(3, F32), "3.0");
        assert_eq!(scalar_from_f64(2.0, C64), "(2.0, 0.0)");
    }

    #[test]
    fn dense_nesting() {
        let xs: Vec<String> = (1..=6).map(|i| i.to_string()).collect();
        assert_eq!(dense_body(&xs, &[2, 3]), "[[1, 2, 3], [4, 5, 6]]");
        assert_eq!(dense_body(&xs, &[6]), "[1, 2, 3, 4, 5, 6]");
        assert_eq!(dense_body(&xs[..1], &[]), "1");
        assert_eq!(dense_body(&[], &[0, 3]), "");
    }
}
