//! hiredis in C (examples/hiredis-baseline, loaded at run time): the C baseline
//! of `builtin:redis`.

use std::ffi::{CStr, CString, c_char, c_int, c_long, c_void};

use super::*;

/// examples/hiredis-baseline's entry points (see hiredis_baseline.c).
type HiredisConnect =
    unsafe extern "C" fn(*const c_char, c_int, *const c_char, *mut c_char, usize) -> *mut c_void;
type HiredisFree = unsafe extern "C" fn(*mut c_void);
type HiredisSave = unsafe extern "C" fn(
    *mut c_void,
    *const c_char,
    *const u8,
    usize,
    usize,
    *const u8,
    usize,
    *const u8,
    usize,
    *mut c_char,
    usize,
) -> c_long;
type HiredisRestore = unsafe extern "C" fn(
    *mut c_void,
    *const c_char,
    usize,
    usize,
    *const u8,
    *mut c_char,
    usize,
) -> c_long;

/// The C baseline: hiredis on one connection, loaded from
/// `libkvwasm_bench_hiredis.so`.
pub(super) struct Hiredis {
    conn: *mut c_void,
    free: HiredisFree,
    save: HiredisSave,
    restore: HiredisRestore,
    /// Keeps the entry points above loaded.
    _library: libloading::Library,
}

/// Room for the C side's error message.
const C_ERROR_ROOM: usize = 256;

fn c_error(buffer: &[c_char]) -> String {
    // SAFETY: the C side writes a NUL-terminated message (vsnprintf) into
    // the zeroed buffer, whose last byte it never overwrites with non-NUL.
    unsafe { CStr::from_ptr(buffer.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

impl Hiredis {
    pub(super) fn connect(library: &Path, address: &str) -> Result<Hiredis, String> {
        let fail = |e: libloading::Error| format!("{}: {e}", library.display());
        // SAFETY: the library is examples/hiredis-baseline, whose
        // initialisers do nothing; the symbols have the types above.
        let (library, connect, free, save, restore) = unsafe {
            let library = libloading::Library::new(library).map_err(fail)?;
            let connect = *library
                .get::<HiredisConnect>(b"kvb_hiredis_connect\0")
                .map_err(fail)?;
            let free = *library
                .get::<HiredisFree>(b"kvb_hiredis_free\0")
                .map_err(fail)?;
            let save = *library
                .get::<HiredisSave>(b"kvb_hiredis_save\0")
                .map_err(fail)?;
            let restore = *library
                .get::<HiredisRestore>(b"kvb_hiredis_restore\0")
                .map_err(fail)?;
            (library, connect, free, save, restore)
        };
        let (host, port) = address
            .rsplit_once(':')
            .and_then(|(h, p)| Some((CString::new(h).ok()?, p.parse::<c_int>().ok()?)))
            .ok_or_else(|| format!("hiredis: {address:?} is not HOST:PORT"))?;
        let password = std::env::var(REDIS_PASSWORD_ENV)
            .ok()
            .map(|p| CString::new(p).map_err(|_| "the Redis password holds a NUL"))
            .transpose()?;
        let mut err = [0 as c_char; C_ERROR_ROOM];
        // SAFETY: NUL-terminated strings that outlive the call, and an
        // error buffer of the size given.
        let conn = unsafe {
            connect(
                host.as_ptr(),
                port,
                password.as_ref().map_or(std::ptr::null(), |p| p.as_ptr()),
                err.as_mut_ptr(),
                err.len(),
            )
        };
        if conn.is_null() {
            return Err(format!("hiredis: {}", c_error(&err)));
        }
        Ok(Hiredis {
            conn,
            free,
            save,
            restore,
            _library: library,
        })
    }
}

impl Drop for Hiredis {
    fn drop(&mut self) {
        // SAFETY: the connection `kvb_hiredis_connect` returned, freed once.
        unsafe { (self.free)(self.conn) }
    }
}

impl Side for Hiredis {
    fn label(&self) -> String {
        "hiredis (C), pipelined".into()
    }

    /// Each `SET … NX` reply says whether the chunk was new.
    fn exact_puts(&self) -> bool {
        true
    }

    fn baseline(&self) -> bool {
        true
    }

    fn save(&self, ns: &str, load: &Load, meter: Meter) -> Result<Measured, String> {
        let base = CString::new(self.base(ns)).map_err(|e| e.to_string())?;
        let hashes = load.hashes.concat();
        let mut err = [0 as c_char; C_ERROR_ROOM];
        let span = meter.start();
        // SAFETY: every pointer is valid for the length given beside it
        // for the call; the connection is this side's alone.
        let stored = unsafe {
            (self.save)(
                self.conn,
                base.as_ptr(),
                hashes.as_ptr(),
                load.hashes.len(),
                8,
                load.data.as_ptr(),
                load.data.len(),
                load.manifest.as_ptr(),
                load.manifest.len(),
                err.as_mut_ptr(),
                err.len(),
            )
        };
        let measured = span.stop();
        if stored < 0 {
            return Err(format!("hiredis save: {}", c_error(&err)));
        }
        // Every save is into a fresh key space: a chunk found already there
        // is a key left over, and the save did less than the others.
        if usize::try_from(stored) != Ok(load.hashes.len()) {
            return Err(format!(
                "hiredis save: {stored} of {} chunks were new in a fresh key space",
                load.hashes.len()
            ));
        }
        Ok(measured)
    }

    fn restore(
        &self,
        ns: &str,
        load: &Load,
        meter: Meter,
        verify: bool,
    ) -> Result<Measured, String> {
        let base = CString::new(self.base(ns)).map_err(|e| e.to_string())?;
        let expect = if verify {
            load.data.as_ptr()
        } else {
            std::ptr::null()
        };
        let mut err = [0 as c_char; C_ERROR_ROOM];
        let span = meter.start();
        // SAFETY: as in `save`; `expect` is null or `load.size` bytes.
        let restored = unsafe {
            (self.restore)(
                self.conn,
                base.as_ptr(),
                8,
                load.size,
                expect,
                err.as_mut_ptr(),
                err.len(),
            )
        };
        let measured = span.stop();
        match usize::try_from(restored) {
            Ok(n) if n == load.hashes.len() => Ok(measured),
            Ok(n) => Err(format!(
                "hiredis restore: {n} chunks, not {}",
                load.hashes.len()
            )),
            Err(_) => Err(format!("hiredis restore: {}", c_error(&err))),
        }
    }

    fn base(&self, ns: &str) -> String {
        format!("hiredis/{ns}")
    }
}
