// FNV-1a, 64 bits: the fingerprint of the .proto files recorded beside the code generated from
// them (src/generated/SOURCES). Included by build.rs and lib.rs's test alike.
|bytes: &[u8]| -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
