//! The `redis` crate's clients, one server and cluster: the Rust baselines of
//! `builtin:redis`.

use super::*;

/// The `redis` crate, pipelined, on one connection.
pub(super) struct NativeRedis {
    conn: std::cell::RefCell<redis::Connection>,
    /// Save as a client that answers each put exactly: a `SET … NX` per
    /// chunk as it is put (one round trip, which stores the chunk and says
    /// whether it was there), then the manifest.
    exact_puts: bool,
}

impl NativeRedis {
    pub(super) fn connect(address: &str, exact_puts: bool) -> Result<NativeRedis, String> {
        let fail = |e: redis::RedisError| format!("redis at {address}: {e}");
        let client = redis::Client::open(format!("redis://{address}/")).map_err(fail)?;
        let mut conn = client.get_connection().map_err(fail)?;
        if let Ok(password) = std::env::var(REDIS_PASSWORD_ENV) {
            redis::cmd("AUTH")
                .arg(password)
                .query::<()>(&mut conn)
                .map_err(fail)?;
        }
        Ok(NativeRedis {
            conn: std::cell::RefCell::new(conn),
            exact_puts,
        })
    }

    /// Delete a key space's keys (after a repetition, untimed).
    pub(super) fn clean(&self, base: &str, load: &Load) -> Result<(), String> {
        let mut pipe = redis::pipe();
        for hash in &load.hashes {
            pipe.del(chunk_key(base, hash)).ignore();
        }
        pipe.del(manifest_key(base)).ignore();
        pipe.query::<()>(&mut self.conn.borrow_mut())
            .map_err(|e| format!("redis DEL: {e}"))
    }
}

impl Side for NativeRedis {
    fn label(&self) -> String {
        if self.exact_puts {
            "redis crate, SET NX per chunk".into()
        } else {
            "redis crate, pipelined".into()
        }
    }

    fn exact_puts(&self) -> bool {
        self.exact_puts
    }

    fn baseline(&self) -> bool {
        !self.exact_puts
    }

    fn twin(&self) -> &'static str {
        if self.exact_puts { "" } else { "redis crate" }
    }

    fn save(&self, ns: &str, load: &Load, meter: Meter) -> Result<Measured, String> {
        let base = self.base(ns);
        let conn = &mut *self.conn.borrow_mut();
        let span = meter.start();
        let mut pipe = redis::pipe();
        for hash in &load.hashes {
            let key = chunk_key(&base, hash);
            if self.exact_puts {
                // `OK` if stored now, nil if it was there: put_chunk's 0 or 1.
                let _stored: Option<String> = redis::cmd("SET")
                    .arg(&key)
                    .arg(load.data.as_slice())
                    .arg("NX")
                    .query(conn)
                    .map_err(|e| format!("redis SET NX: {e}"))?;
            } else {
                pipe.set(key, load.data.as_slice()).ignore();
            }
        }
        pipe.set(manifest_key(&base), load.manifest.as_slice())
            .ignore();
        pipe.query::<()>(conn)
            .map_err(|e| format!("redis SET: {e}"))?;
        Ok(span.stop())
    }

    fn restore(
        &self,
        ns: &str,
        load: &Load,
        meter: Meter,
        verify: bool,
    ) -> Result<Measured, String> {
        let base = self.base(ns);
        let conn = &mut *self.conn.borrow_mut();
        let span = meter.start();
        let manifest: Vec<u8> = redis::cmd("GET")
            .arg(manifest_key(&base))
            .query(conn)
            .map_err(|e| format!("redis GET: {e}"))?;
        check_manifest(&manifest, load)?;
        let mut pipe = redis::pipe();
        for hash in manifest_hashes(&manifest) {
            pipe.get(chunk_key(&base, &hash));
        }
        let values: Vec<Vec<u8>> = pipe.query(conn).map_err(|e| format!("redis GET: {e}"))?;
        for value in &values {
            deliver(value, load, verify)?;
        }
        Ok(span.stop())
    }

    fn base(&self, ns: &str) -> String {
        format!("native/{ns}")
    }
}

/// The `redis` crate's cluster client: each pipeline is split by slot and
/// sent as one pipeline per node.
pub(super) struct NativeCluster {
    conn: std::cell::RefCell<redis::cluster::ClusterConnection>,
    /// Save with a `SET … NX` per chunk, routed to its node, as it is put
    /// (as [`NativeRedis`]'s `exact_puts`): the floor of a cluster client
    /// that answers each put exactly.
    exact_puts: bool,
}

impl NativeCluster {
    pub(super) fn connect(nodes: &[String], exact_puts: bool) -> Result<NativeCluster, String> {
        let fail = |e: redis::RedisError| format!("redis cluster at {nodes:?}: {e}");
        let mut client =
            redis::cluster::ClusterClient::builder(nodes.iter().map(|n| format!("redis://{n}/")));
        if let Ok(password) = std::env::var(REDIS_PASSWORD_ENV) {
            client = client.password(password);
        }
        let conn = client
            .build()
            .map_err(fail)?
            .get_connection()
            .map_err(fail)?;
        Ok(NativeCluster {
            conn: std::cell::RefCell::new(conn),
            exact_puts,
        })
    }

    /// Delete a key space's keys (after a repetition, untimed).
    pub(super) fn clean(&self, base: &str, load: &Load) -> Result<(), String> {
        let mut pipe = redis::cluster::cluster_pipe();
        for hash in &load.hashes {
            pipe.cmd("DEL").arg(chunk_key(base, hash)).ignore();
        }
        pipe.cmd("DEL").arg(manifest_key(base)).ignore();
        pipe.exec(&mut self.conn.borrow_mut())
            .map_err(|e| format!("redis cluster DEL: {e}"))
    }
}

impl Side for NativeCluster {
    fn label(&self) -> String {
        if self.exact_puts {
            "redis crate, cluster, SET NX per chunk".into()
        } else {
            "redis crate, cluster, pipelined per node".into()
        }
    }

    fn exact_puts(&self) -> bool {
        self.exact_puts
    }

    fn baseline(&self) -> bool {
        !self.exact_puts
    }

    fn cluster(&self) -> bool {
        true
    }

    fn twin(&self) -> &'static str {
        if self.exact_puts { "" } else { "redis crate" }
    }

    fn save(&self, ns: &str, load: &Load, meter: Meter) -> Result<Measured, String> {
        let base = self.base(ns);
        let conn = &mut *self.conn.borrow_mut();
        let span = meter.start();
        let mut pipe = redis::cluster::cluster_pipe();
        for hash in &load.hashes {
            let key = chunk_key(&base, hash);
            if self.exact_puts {
                // `OK` if stored now, nil if it was there: put_chunk's 0 or 1.
                let _stored: Option<String> = redis::cmd("SET")
                    .arg(&key)
                    .arg(load.data.as_slice())
                    .arg("NX")
                    .query(conn)
                    .map_err(|e| format!("redis cluster SET NX: {e}"))?;
                continue;
            }
            pipe.cmd("SET").arg(key).arg(load.data.as_slice()).ignore();
        }
        pipe.cmd("SET")
            .arg(manifest_key(&base))
            .arg(load.manifest.as_slice())
            .ignore();
        pipe.exec(conn)
            .map_err(|e| format!("redis cluster SET: {e}"))?;
        Ok(span.stop())
    }

    fn restore(
        &self,
        ns: &str,
        load: &Load,
        meter: Meter,
        verify: bool,
    ) -> Result<Measured, String> {
        let base = self.base(ns);
        let conn = &mut *self.conn.borrow_mut();
        let span = meter.start();
        let manifest: Vec<u8> = redis::cmd("GET")
            .arg(manifest_key(&base))
            .query(conn)
            .map_err(|e| format!("redis cluster GET: {e}"))?;
        check_manifest(&manifest, load)?;
        let mut pipe = redis::cluster::cluster_pipe();
        for hash in manifest_hashes(&manifest) {
            pipe.cmd("GET").arg(chunk_key(&base, &hash));
        }
        let values: Vec<Vec<u8>> = pipe
            .query(conn)
            .map_err(|e| format!("redis cluster GET: {e}"))?;
        for value in &values {
            deliver(value, load, verify)?;
        }
        Ok(span.stop())
    }

    fn base(&self, ns: &str) -> String {
        format!("native-cluster/{ns}")
    }
}
