//! A plugin descriptor whose every field comes from fuzz bytes and whose every pointer is
//! valid: the descriptor's data (what a hostile or careless plugin can get wrong) is fuzzed,
//! not the process's memory.

use amk_plugin_abi::{
    AmkStr, CpuArgsV1, CpuReferenceFnV1, OpDescriptorV1, ParamDeclV1, PluginDescriptorV1,
};

/// Reads fields off the input, zero past its end.
struct Reader<'a> {
    data: &'a [u8],
}

impl Reader<'_> {
    fn u8(&mut self) -> u8 {
        let Some((&b, rest)) = self.data.split_first() else {
            return 0;
        };
        self.data = rest;
        b
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    /// A byte string of up to 63 bytes (its length the first byte's low six bits).
    fn bytes(&mut self) -> Vec<u8> {
        let n = (self.u8() & 63) as usize;
        (0..n).map(|_| self.u8()).collect()
    }
    /// A value near `near` most of the time (the checks' boundaries), any `u32` otherwise.
    fn near(&mut self, near: u32) -> u32 {
        match self.u8() % 4 {
            0 => self.u32(),
            k => near.wrapping_add(u32::from(k)).wrapping_sub(2),
        }
    }
}

/// One op's owned data.
struct Op {
    name: Vec<u8>,
    summary: Vec<u8>,
    fields: [u32; 5],
    params: Vec<(Vec<u8>, u32, u32)>,
    cuda: [Vec<u8>; 2],
    reference: bool,
}

/// The whole descriptor's owned data; [`Descriptor::raw`] points into it.
pub struct Descriptor {
    versions: [u32; 3],
    name: Vec<u8>,
    version: Vec<u8>,
    ops: Vec<Op>,
    raw_params: Vec<Vec<ParamDeclV1>>,
    raw_ops: Vec<OpDescriptorV1>,
}

fn amk_str(b: &[u8]) -> AmkStr {
    AmkStr {
        ptr: if b.is_empty() {
            std::ptr::null()
        } else {
            b.as_ptr()
        },
        len: b.len(),
    }
}

/// A CPU reference that refuses every call (the registration never runs it; `unsafe` only
/// for the ABI's function type: it reads nothing).
#[allow(unsafe_code)]
unsafe extern "C" fn never(_: *const CpuArgsV1, _: *mut u8, _: usize) -> i32 {
    1
}

impl Descriptor {
    /// The descriptor the bytes describe: up to 4 ops of up to 4 params each.
    pub fn from_bytes(data: &[u8]) -> Descriptor {
        let mut r = Reader { data };
        let versions = [
            r.near(amk_plugin_abi::ABI_VERSION),
            r.near(std::mem::size_of::<PluginDescriptorV1>() as u32),
            r.near(std::mem::size_of::<OpDescriptorV1>() as u32),
        ];
        let (name, version) = (r.bytes(), r.bytes());
        let n_ops = (r.u8() % 5) as usize;
        let ops = (0..n_ops)
            .map(|_| Op {
                name: r.bytes(),
                summary: r.bytes(),
                fields: [
                    r.near(amk_plugin_abi::FIRST_PLUGIN_CODE),
                    r.near(1),
                    r.near(2),
                    r.near(1),
                    r.near(0),
                ],
                params: (0..r.u8() % 5)
                    .map(|_| (r.bytes(), r.near(1), r.near(1)))
                    .collect(),
                cuda: [r.bytes(), r.bytes()],
                reference: r.u8().is_multiple_of(2),
            })
            .collect();
        let mut d = Descriptor {
            versions,
            name,
            version,
            ops,
            raw_params: Vec::new(),
            raw_ops: Vec::new(),
        };
        d.link();
        d
    }

    /// The raw tables pointing into the owned data (built once: the vectors never move after).
    fn link(&mut self) {
        self.raw_params = (self.ops.iter())
            .map(|op| {
                (op.params.iter())
                    .map(|(name, ty, required)| ParamDeclV1 {
                        name: amk_str(name),
                        ty: *ty,
                        required: *required,
                    })
                    .collect()
            })
            .collect();
        self.raw_ops = (self.ops.iter().zip(&self.raw_params))
            .map(|(op, params)| OpDescriptorV1 {
                name: amk_str(&op.name),
                summary: amk_str(&op.summary),
                code: op.fields[0],
                min_inputs: op.fields[1],
                max_inputs: op.fields[2],
                n_outputs: op.fields[3],
                params: if params.is_empty() {
                    std::ptr::null()
                } else {
                    params.as_ptr()
                },
                n_params: params.len(),
                cpu_reference: op.reference.then_some(never as CpuReferenceFnV1),
                cuda_source: amk_str(&op.cuda[0]),
                cuda_entry: amk_str(&op.cuda[1]),
                cuda_shared_bytes: op.fields[4],
            })
            .collect();
    }

    /// The descriptor as a plugin's entry function returns it.
    pub fn raw(&self) -> PluginDescriptorV1 {
        PluginDescriptorV1 {
            abi_version: self.versions[0],
            struct_size: self.versions[1],
            op_struct_size: self.versions[2],
            name: amk_str(&self.name),
            version: amk_str(&self.version),
            ops: if self.raw_ops.is_empty() {
                std::ptr::null()
            } else {
                self.raw_ops.as_ptr()
            },
            n_ops: self.raw_ops.len(),
        }
    }
}
