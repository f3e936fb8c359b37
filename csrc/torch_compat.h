// The differences between the torch releases torchtpu builds against (2.11 to 2.15), in one
// place: the shim is compiled for exactly one of them (build.rs), and torchtpu refuses to load
// into another (python/torchtpu/_extension.py). A difference goes here as a macro or an inline
// function (keyed on what the headers have, or on TT_TORCH_AT_LEAST), and the shim uses that.
#pragma once
#include <torch/headeronly/version.h>

#define TT_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// Named tensors: torch 2.14 removed them; older releases' autocast op lists (expanded in the
// shim's autocast registration) name overloads taking a DimnameList.
#if __has_include(<ATen/core/Dimname.h>)
#include <ATen/core/Dimname.h>
#define TT_USING_DIMNAME_LIST using at::DimnameList;
#else
#define TT_USING_DIMNAME_LIST
#endif
