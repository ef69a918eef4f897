job "web" {
  group "g" {
    service {
      connect {
        sidecar_service {
          proxy {
            upstreams {
              destination_name = "db"
              local_bind_port  = 70000
              port             = 1
            }
          }
        }
        gateway {}
      }
    }
    task "t" {
      driver = "raw_exec"
      lifecycle {
        hook = "prestart"
        when = "now"
      }
    }
  }
}
