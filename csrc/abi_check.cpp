// A compile-time check that abi.h and its Rust mirror (crates/abi) lay out the C ABI the same
// way: build.rs writes the Rust side (sizes, offsets, values) into abi_layout.h.
#include <cstddef>

#include "abi.h"
#include "abi_layout.h"

namespace {
// The number of members of an aggregate: the most initializers T{...} accepts.
struct Any {
  template <class T> operator T() const;
};
template <class T, class... A>
constexpr size_t field_count() {
  if constexpr (requires { T{A{}..., Any{}}; }) return field_count<T, A..., Any>();
  else return sizeof...(A);
}
}  // namespace

#define TT_DIFFERS(WHAT) "csrc/abi.h and its Rust mirror crates/abi/src/lib.rs differ in " WHAT
#define TT_CHECK_STRUCT(S, SIZE, ALIGN, FIELDS)                  \
  static_assert(sizeof(S) == SIZE, TT_DIFFERS("sizeof(" #S ")")); \
  static_assert(alignof(S) == ALIGN, TT_DIFFERS("alignof(" #S ")")); \
  static_assert(field_count<S>() == FIELDS, TT_DIFFERS("the number of fields of " #S));
#define TT_CHECK_FIELD(S, F, OFFSET, SIZE)                                      \
  static_assert(offsetof(S, F) == OFFSET, TT_DIFFERS("the offset of " #S "." #F)); \
  static_assert(sizeof(((S*)nullptr)->F) == SIZE, TT_DIFFERS("the size of " #S "." #F));
#define TT_CHECK_CONSTANT(NAME, VALUE) static_assert(NAME == VALUE, TT_DIFFERS("the value of " #NAME));

TT_RUST_STRUCTS(TT_CHECK_STRUCT)
TT_RUST_FIELDS(TT_CHECK_FIELD)
TT_RUST_CONSTANTS(TT_CHECK_CONSTANT)
