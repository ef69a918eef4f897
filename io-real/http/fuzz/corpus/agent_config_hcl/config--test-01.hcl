name       = "server-1"
region     = "eu"
datacenter = "eu-west-1"
data_dir   = "/var/lib/nomad"
bind_addr  = "10.0.0.5"

ports {
  http = 5646
  rpc  = 5647
  serf = 5648
}

advertise {
  rpc = "192.168.1.5"
}

server {
  enabled                = true
  bootstrap_expect       = 3
  heartbeat_grace        = "20s"
  min_heartbeat_ttl      = "15s"
  failover_heartbeat_ttl = "10m"
  server_join {
    retry_join     = ["10.0.0.6", "10.0.0.7:5648"]
    retry_interval = "15s"
  }
}

client {
  enabled = false
}

telemetry {
  publish_allocation_metrics = true
}

acl {
  enabled = true
}
