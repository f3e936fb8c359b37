//! Value helpers shared by the engine's modules: torch dtypes as PJRT element types, Python
//! numbers as scalar bytes, and the random-key mixer. Imports nothing of the engine, so any
//! module may use it.
use lowerings::DType;
use stablehlo::ElemType;

pub fn element_type(d: DType) -> pjrt::ElementType {
    use pjrt::ElementType as E;
    match d {
        DType::Bool => E::Pred,
        DType::U8 => E::U8,
        DType::I8 => E::S8,
        DType::I16 => E::S16,
        DType::I32 => E::S32,
        DType::I64 => E::S64,
        DType::U16 => E::U16,
        DType::U32 => E::U32,
        DType::U64 => E::U64,
        DType::F16 => E::F16,
        DType::BF16 => E::BF16,
        DType::F32 => E::F32,
        DType::F64 => E::F64,
        DType::C64 => E::C64,
        DType::C128 => E::C128,
        DType::F8E5M2 => E::F8E5M2,
        DType::F8E4M3FN => E::F8E4M3FN,
        DType::F8E5M2FNUZ => E::F8E5M2FNUZ,
        DType::F8E4M3FNUZ => E::F8E4M3FNUZ,
        DType::F8E8M0FNU => E::F8E8M0FNU,
        // Bytes to the plugin (PJRT's F4E2M1FN is one value per element).
        DType::F4E2M1FNX2 => E::U8,
    }
}

/// A float scalar's bytes in `elem` (as PyTorch converts a Python number to a tensor dtype).
pub fn scalar_bytes(x: f64, elem: ElemType) -> ([u8; 16], usize) {
    let mut b = [0u8; 16];
    let n = match elem {
        ElemType::F64 => put(&mut b, &x.to_le_bytes()),
        ElemType::F32 => put(&mut b, &(x as f32).to_le_bytes()),
        ElemType::F16 => put(&mut b, &half::f16::from_f64(x).to_le_bytes()),
        ElemType::BF16 => put(&mut b, &half::bf16::from_f64(x).to_le_bytes()),
        ElemType::I64 => put(&mut b, &(x as i64).to_le_bytes()),
        ElemType::I32 => put(&mut b, &(x as i64 as i32).to_le_bytes()),
        ElemType::I16 => put(&mut b, &(x as i64 as i16).to_le_bytes()),
        ElemType::I8 => put(&mut b, &(x as i64 as i8).to_le_bytes()),
        ElemType::U8 | ElemType::F4E2M1FNX2 => put(&mut b, &(x as i64 as u8).to_le_bytes()),
        ElemType::U16 => put(&mut b, &(x as i64 as u16).to_le_bytes()),
        ElemType::U32 => put(&mut b, &(x as i64 as u32).to_le_bytes()),
        ElemType::U64 => put(&mut b, &(x as u64).to_le_bytes()),
        ElemType::Pred => put(&mut b, &[(x != 0.0) as u8]),
        ElemType::C64 => {
            put(&mut b, &(x as f32).to_le_bytes());
            8
        }
        ElemType::C128 => {
            put(&mut b, &x.to_le_bytes());
            16
        }
        f8 => put(&mut b, &[stablehlo::f8_bits(x, f8)]),
    };
    (b, n)
}

fn put(dst: &mut [u8; 16], src: &[u8]) -> usize {
    dst[..src.len()].copy_from_slice(src);
    src.len()
}

/// splitmix64: spreads (seed, offset) into independent random keys.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
