client {
  enabled = true
  servers = ["127.0.0.1", "127.0.0.2:5647", "[::1]"]
  host_volume "certs" {
    path      = "/etc/ssl/certs"
    read_only = true
  }
  host_volume "data" {
    path = "/srv/data"
  }
}
