client {
  enabled           = true
  servers           = ["127.0.0.1"]
  network_interface = "lo"
  min_dynamic_port  = 25000
  max_dynamic_port  = 26000
  reserved {
    reserved_ports = "22,8500-8502"
  }
}
