//! Endpoint changes without a reload: a loaded backend's servers are slots, each
//! serving one endpoint or spare (in maintenance), and a backend's new servers are
//! reached by runtime API commands, on those slots or on servers added at run time:
//!
//! - an endpoint that stays keeps its slot; a changed weight is `set server <b>/<s>
//!   weight <w>`;
//! - an endpoint that goes puts its slot in maintenance (`state maint`): the slot is
//!   spare again, and a spare beyond the number a backend keeps
//!   ([`LoadedBackend::spares_beyond`]) is deleted (`del server`) once HAProxy lets it
//!   (no connection left on it);
//! - an endpoint that comes takes a spare slot: `addr <ip> port <port>`, its weight,
//!   `state ready` (and, for a health-checked backend, `health up`: it serves at once,
//!   and its checks take over);
//! - with no spare slot, it is added to HAProxy (`add server <b>/_dynamic-pod-<n>
//!   <ip>:<port> id <id> weight <w>` and the backend's server options, then `enable server`,
//!   and `enable health` for a health-checked backend; `enable dynamic-cookie backend`
//!   gives it its sticky cookie), where the backend's balance algorithm allows it
//!   ([`AddServers`]).
//!
//! What neither takes needs a reload ([`NeedsReload`]): more endpoints than spare
//! slots in a backend that takes no added server, an endpoint speaking HTTP/2 in clear
//! (`proto h2`, a server option) that no server can be added for, an idled service's
//! cluster IP (served without health checks, as the router forces a reload for), or,
//! for a reencrypt route verified by host name, an endpoint of another service than
//! the primary one (the slots and added servers verify the primary service's name).
//!
//! Pure: [`LoadedBackend::update`] says which commands bring HAProxy to a new plan, and
//! records that HAProxy holds it once they are sent.

use super::model::BackendPlan;
use super::render::{
    AddServers, RenderedBackend, RenderedServer, SPARE_SERVER_PREFIX, ServerTarget,
};

/// Why a backend's new servers need a reload.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NeedsReload {
    /// More endpoints than slots.
    #[error("backend {backend}: {wanted} servers wanted, {slots} slots")]
    NoSpareSlot {
        /// The backend.
        backend: String,
        /// Servers the plan has.
        wanted: usize,
        /// Slots the backend has.
        slots: usize,
    },
    /// An endpoint a slot's options cannot serve.
    #[error("backend {backend}: server {server} needs options its slots do not have ({why})")]
    Options {
        /// The backend.
        backend: String,
        /// The endpoint.
        server: String,
        /// Which option.
        why: &'static str,
    },
}

/// A backend as HAProxy holds it now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadedBackend {
    /// Its name.
    pub name: String,
    /// Its servers (slots), as rendered or as changed since.
    pub slots: Vec<RenderedServer>,
    /// Whether its servers are health-checked.
    pub checked: bool,
    /// The service name its spare slots verify (reencrypt routes verified by host), if
    /// they verify one.
    pub verified_host: Option<String>,
    /// How servers are added to it at run time, if they can be.
    pub add: Option<AddServers>,
}

impl LoadedBackend {
    /// A backend as the configuration HAProxy loaded renders it.
    pub fn loaded(rendered: &RenderedBackend, verified_host: Option<String>) -> Self {
        Self {
            name: rendered.name.clone(),
            slots: rendered.servers.clone(),
            checked: rendered.checked,
            verified_host,
            add: rendered.add.clone(),
        }
    }

    /// The spare slots beyond the first `keep`: the servers to delete. None in a
    /// backend that takes no server added at run time (its spares are all it has).
    pub fn spares_beyond(&self, keep: usize) -> Vec<String> {
        if self.add.is_none() {
            return Vec::new();
        }
        self.slots
            .iter()
            .filter(|slot| slot.target.is_none())
            .skip(keep)
            .map(|slot| slot.name.clone())
            .collect()
    }

    /// HAProxy deleted the spare slot `name`.
    pub fn deleted(&mut self, name: &str) {
        self.slots
            .retain(|slot| slot.name != name || slot.target.is_some());
    }

    /// The commands that bring this backend to `plan`, or why they cannot; on success
    /// the slots are updated as if the commands ran.
    pub fn update(&mut self, plan: &BackendPlan) -> Result<Vec<String>, NeedsReload> {
        // An idled service's cluster IP is served without health checks, which a
        // slot's options cannot drop (a check would wake the service): a reload, as
        // the router does.
        if let Some(server) = plan.servers.iter().find(|server| !server.health_check) {
            return Err(NeedsReload::Options {
                backend: self.name.clone(),
                server: server.id.clone(),
                why: "no health check (an idled service)",
            });
        }
        let wanted: Vec<ServerTarget> = plan
            .servers
            .iter()
            .map(|server| ServerTarget {
                ip: server.ip.clone(),
                port: server.port,
                weight: server.weight,
            })
            .collect();
        if wanted.len() > self.slots.len() && self.add.is_none() {
            return Err(NeedsReload::NoSpareSlot {
                backend: self.name.clone(),
                wanted: wanted.len(),
                slots: self.slots.len(),
            });
        }
        let mut slots = self.slots.clone();
        let mut add = self.add.clone();
        let mut added = false;
        let mut commands = Vec::new();
        let backend = &self.name;
        let matched = keep_or_retire(backend, &mut slots, &wanted, &mut commands);
        for (i, server) in plan.servers.iter().enumerate() {
            if matched[i] {
                continue;
            }
            if let Some(host) = &self.verified_host
                && *host != server.service_host
            {
                return Err(NeedsReload::Options {
                    backend: backend.clone(),
                    server: server.id.clone(),
                    why: "verifyhost of another service",
                });
            }
            let target = &wanted[i];
            // A spare slot serves no HTTP/2 in clear (`proto h2` is fixed at its
            // load): an added server does.
            let spare = if server.h2c {
                None
            } else {
                slots.iter().position(|slot| slot.target.is_none())
            };
            match (spare, &mut add) {
                (Some(index), _) => {
                    fill_slot(
                        backend,
                        &mut slots[index],
                        target,
                        self.checked,
                        &mut commands,
                    );
                }
                (None, Some(add)) => {
                    let server = add_server(
                        backend,
                        add,
                        server.h2c,
                        target,
                        self.checked,
                        &mut commands,
                    );
                    slots.push(server);
                    added = true;
                }
                (None, None) if server.h2c => {
                    return Err(NeedsReload::Options {
                        backend: backend.clone(),
                        server: server.id.clone(),
                        why: "proto h2",
                    });
                }
                (None, None) => {
                    return Err(NeedsReload::NoSpareSlot {
                        backend: backend.clone(),
                        wanted: wanted.len(),
                        slots: self.slots.len(),
                    });
                }
            }
        }
        if added && add.as_ref().is_some_and(|add| add.cookies) {
            commands.push(format!("enable dynamic-cookie backend {backend}"));
        }
        self.slots = slots;
        self.add = add;
        Ok(commands)
    }
}

/// Keeps each slot whose target is still wanted (its weight set if it changed) and puts
/// the others in maintenance; returns which of `wanted` a slot already serves.
fn keep_or_retire(
    backend: &str,
    slots: &mut [RenderedServer],
    wanted: &[ServerTarget],
    commands: &mut Vec<String>,
) -> Vec<bool> {
    let mut matched = vec![false; wanted.len()];
    for slot in slots {
        let Some(target) = &slot.target else {
            continue;
        };
        let found = wanted
            .iter()
            .enumerate()
            .find(|(i, w)| !matched[*i] && w.ip == target.ip && w.port == target.port);
        match found {
            Some((i, w)) => {
                matched[i] = true;
                if w.weight != target.weight {
                    commands.push(format!(
                        "set server {backend}/{} weight {}",
                        slot.name, w.weight
                    ));
                    slot.target = Some(w.clone());
                }
            }
            None => {
                commands.push(format!("set server {backend}/{} state maint", slot.name));
                slot.target = None;
            }
        }
    }
    matched
}

/// Points the free slot at `target` and brings it up.
fn fill_slot(
    backend: &str,
    slot: &mut RenderedServer,
    target: &ServerTarget,
    checked: bool,
    commands: &mut Vec<String>,
) {
    commands.push(format!(
        "set server {backend}/{} addr {} port {}",
        slot.name,
        target.ip.trim_start_matches('[').trim_end_matches(']'),
        target.port
    ));
    commands.push(format!(
        "set server {backend}/{} weight {}",
        slot.name, target.weight
    ));
    commands.push(format!("set server {backend}/{} state ready", slot.name));
    if checked {
        commands.push(format!("set server {backend}/{} health up", slot.name));
    }
    slot.target = Some(target.clone());
}

/// Adds a server for `target` at run time (the next name and id of `add`) and enables
/// it; returns it as rendered.
fn add_server(
    backend: &str,
    add: &mut AddServers,
    h2c: bool,
    target: &ServerTarget,
    checked: bool,
    commands: &mut Vec<String>,
) -> RenderedServer {
    let name = format!("{SPARE_SERVER_PREFIX}{}", add.next);
    let id = add.next_id;
    add.next += 1;
    add.next_id += 1;
    let proto = if h2c && add.h2c { " proto h2" } else { "" };
    commands.push(format!(
        "add server {backend}/{name} {}:{} id {id} weight {}{proto}{}",
        target.ip, target.port, target.weight, add.options
    ));
    commands.push(format!("enable server {backend}/{name}"));
    if checked {
        commands.push(format!("enable health {backend}/{name}"));
    }
    RenderedServer {
        name,
        target: Some(target.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::model::Server;

    fn plan(servers: &[(&str, u16, u16)]) -> BackendPlan {
        BackendPlan {
            name: "be_http:shop:r".into(),
            servers: servers
                .iter()
                .map(|(ip, port, weight)| Server {
                    id: format!("ept:web:http:{ip}:{port}"),
                    ip: (*ip).into(),
                    port: *port,
                    weight: *weight,
                    h2c: false,
                    service_host: "web.shop.svc".into(),
                    health_check: true,
                })
                .collect(),
            active_endpoints: servers.len(),
            active_services: 1,
        }
    }

    fn loaded(servers: &[(&str, u16, u16)], spare: usize) -> LoadedBackend {
        let mut slots: Vec<RenderedServer> = servers
            .iter()
            .map(|(ip, port, weight)| RenderedServer {
                name: format!("ept:web:http:{ip}:{port}"),
                target: Some(ServerTarget {
                    ip: (*ip).into(),
                    port: *port,
                    weight: *weight,
                }),
            })
            .collect();
        for n in 1..=spare {
            slots.push(RenderedServer {
                name: format!("_dynamic-pod-{n}"),
                target: None,
            });
        }
        LoadedBackend {
            name: "be_http:shop:r".into(),
            slots,
            checked: false,
            verified_host: None,
            add: None,
        }
    }

    #[test]
    fn endpoints_move_into_spare_slots_and_out_again() {
        let mut backend = loaded(&[("10.0.0.1", 80, 1)], 2);
        let commands = backend
            .update(&plan(&[("10.0.0.1", 80, 1), ("10.0.0.2", 80, 1)]))
            .unwrap();
        assert_eq!(
            commands,
            [
                "set server be_http:shop:r/_dynamic-pod-1 addr 10.0.0.2 port 80",
                "set server be_http:shop:r/_dynamic-pod-1 weight 1",
                "set server be_http:shop:r/_dynamic-pod-1 state ready",
            ]
        );
        // The same plan again: nothing to do.
        assert!(
            backend
                .update(&plan(&[("10.0.0.1", 80, 1), ("10.0.0.2", 80, 1)]))
                .unwrap()
                .is_empty()
        );
        // The first endpoint goes, a weight changes, another comes into its slot.
        let commands = backend
            .update(&plan(&[("10.0.0.2", 80, 7), ("10.0.0.3", 80, 7)]))
            .unwrap();
        assert_eq!(
            commands,
            [
                "set server be_http:shop:r/ept:web:http:10.0.0.1:80 state maint",
                "set server be_http:shop:r/_dynamic-pod-1 weight 7",
                "set server be_http:shop:r/ept:web:http:10.0.0.1:80 addr 10.0.0.3 port 80",
                "set server be_http:shop:r/ept:web:http:10.0.0.1:80 weight 7",
                "set server be_http:shop:r/ept:web:http:10.0.0.1:80 state ready",
            ]
        );
        // Everything goes.
        let commands = backend.update(&plan(&[])).unwrap();
        assert_eq!(commands.len(), 2);
        assert!(backend.slots.iter().all(|slot| slot.target.is_none()));
    }

    #[test]
    fn what_slots_cannot_take_needs_a_reload_and_changes_nothing() {
        let mut backend = loaded(&[], 1);
        let before = backend.clone();
        let error = backend
            .update(&plan(&[("10.0.0.1", 80, 1), ("10.0.0.2", 80, 1)]))
            .unwrap_err();
        assert!(matches!(
            error,
            NeedsReload::NoSpareSlot {
                wanted: 2,
                slots: 1,
                ..
            }
        ));
        assert_eq!(backend, before);
        let mut h2c = plan(&[("10.0.0.1", 80, 1)]);
        h2c.servers[0].h2c = true;
        assert!(matches!(
            backend.update(&h2c),
            Err(NeedsReload::Options {
                why: "proto h2",
                ..
            })
        ));
        // An idled service's cluster IP, even one a slot already serves.
        let mut serving = loaded(&[("10.96.0.7", 80, 1)], 1);
        let before = serving.clone();
        let mut idled = plan(&[("10.96.0.7", 80, 1)]);
        idled.servers[0].health_check = false;
        assert!(matches!(
            serving.update(&idled),
            Err(NeedsReload::Options {
                why: "no health check (an idled service)",
                ..
            })
        ));
        assert_eq!(serving, before);
        let mut verified = loaded(&[], 2);
        verified.verified_host = Some("web.shop.svc".into());
        verified.checked = true;
        let mut other = plan(&[("10.0.0.1", 80, 1), ("10.0.0.9", 80, 1)]);
        other.servers[1].service_host = "canary.shop.svc".into();
        assert!(matches!(
            verified.update(&other),
            Err(NeedsReload::Options { .. })
        ));
        let commands = verified.update(&plan(&[("10.0.0.1", 80, 1)])).unwrap();
        assert_eq!(
            commands.last().unwrap(),
            "set server be_http:shop:r/_dynamic-pod-1 health up"
        );
        // An IPv6 endpoint's address goes without brackets.
        let mut v6 = loaded(&[], 1);
        let commands = v6.update(&plan(&[("[2001:db8::1]", 80, 1)])).unwrap();
        assert_eq!(
            commands[0],
            "set server be_http:shop:r/_dynamic-pod-1 addr 2001:db8::1 port 80"
        );
    }

    fn growing(slots: &[(&str, u16, u16)], spare: usize) -> LoadedBackend {
        let mut backend = loaded(slots, spare);
        backend.add = Some(AddServers {
            options: " maxconn 10".into(),
            h2c: true,
            cookies: true,
            next: spare + 1,
            next_id: slots.len() + spare + 1,
        });
        backend
    }

    #[test]
    fn endpoints_beyond_the_slots_are_added_and_the_servers_left_deleted() {
        let mut backend = growing(&[("10.0.0.1", 80, 1)], 1);
        let commands = backend
            .update(&plan(&[
                ("10.0.0.1", 80, 1),
                ("10.0.0.2", 80, 1),
                ("10.0.0.3", 80, 1),
                ("[2001:db8::4]", 80, 1),
            ]))
            .unwrap();
        assert_eq!(
            commands,
            [
                "set server be_http:shop:r/_dynamic-pod-1 addr 10.0.0.2 port 80",
                "set server be_http:shop:r/_dynamic-pod-1 weight 1",
                "set server be_http:shop:r/_dynamic-pod-1 state ready",
                "add server be_http:shop:r/_dynamic-pod-2 10.0.0.3:80 id 3 weight 1 maxconn 10",
                "enable server be_http:shop:r/_dynamic-pod-2",
                "add server be_http:shop:r/_dynamic-pod-3 [2001:db8::4]:80 id 4 weight 1 maxconn 10",
                "enable server be_http:shop:r/_dynamic-pod-3",
                "enable dynamic-cookie backend be_http:shop:r",
            ]
        );
        assert_eq!(backend.slots.len(), 4);
        assert!(backend.spares_beyond(0).is_empty());
        // Three go: their servers are in maintenance, spare; all but the first one
        // (kept) are to be deleted.
        let commands = backend.update(&plan(&[("10.0.0.3", 80, 1)])).unwrap();
        assert_eq!(commands.len(), 3);
        assert!(commands.iter().all(|c| c.ends_with("state maint")));
        assert_eq!(
            backend.spares_beyond(1),
            ["_dynamic-pod-1", "_dynamic-pod-3"]
        );
        backend.deleted("_dynamic-pod-1");
        // A server that serves is never deleted.
        backend.deleted("_dynamic-pod-2");
        assert_eq!(backend.slots.len(), 3);
        assert_eq!(backend.spares_beyond(1), ["_dynamic-pod-3"]);
        // An endpoint that comes takes a spare before any server is added; a checked
        // backend's added servers get their checks enabled; names are never reused.
        backend.checked = true;
        let commands = backend
            .update(&plan(&[
                ("10.0.0.3", 80, 1),
                ("10.0.0.5", 80, 1),
                ("10.0.0.6", 80, 1),
                ("10.0.0.7", 80, 1),
                ("10.0.0.8", 80, 1),
            ]))
            .unwrap();
        let added: Vec<&String> = commands
            .iter()
            .filter(|c| c.starts_with("add server") || c.starts_with("enable health"))
            .collect();
        assert_eq!(
            added,
            [
                "add server be_http:shop:r/_dynamic-pod-4 10.0.0.7:80 id 5 weight 1 maxconn 10",
                "enable health be_http:shop:r/_dynamic-pod-4",
                "add server be_http:shop:r/_dynamic-pod-5 10.0.0.8:80 id 6 weight 1 maxconn 10",
                "enable health be_http:shop:r/_dynamic-pod-5",
            ]
        );
        assert_eq!(backend.slots.len(), 5);
    }

    #[test]
    fn an_h2c_endpoint_is_added_with_its_protocol_never_put_in_a_spare_slot() {
        let mut backend = growing(&[], 1);
        let mut h2c = plan(&[("10.0.0.1", 80, 1)]);
        h2c.servers[0].h2c = true;
        let commands = backend.update(&h2c).unwrap();
        assert_eq!(
            commands[0],
            "add server be_http:shop:r/_dynamic-pod-2 10.0.0.1:80 id 2 weight 1 proto h2 maxconn 10"
        );
        assert_eq!(backend.spares_beyond(0), ["_dynamic-pod-1"]);
        // A backend that speaks TLS to its servers (reencrypt) has no `proto h2`.
        let mut reencrypt = growing(&[], 0);
        if let Some(add) = &mut reencrypt.add {
            add.h2c = false;
            add.cookies = false;
        }
        let commands = reencrypt.update(&h2c).unwrap();
        assert_eq!(
            commands,
            [
                "add server be_http:shop:r/_dynamic-pod-1 10.0.0.1:80 id 1 weight 1 maxconn 10",
                "enable server be_http:shop:r/_dynamic-pod-1",
            ]
        );
    }
}
