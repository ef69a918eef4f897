job "countdash" {
  datacenters = ["dc1"]
  group "api" {
    network {
      port "http" {}
    }
    service {
      name = "count-api"
      port = "http"
      connect {
        sidecar_service {
          tags = ["proxy"]
          proxy {
            upstreams {
              destination_name = "count-db"
              local_bind_port  = 8080
            }
            config {
              protocol = "http"
            }
          }
        }
        sidecar_task {
          driver = "raw_exec"
          config {
            command = "/usr/bin/envoy"
            args    = ["-c", "${NOMAD_SECRETS_DIR}/envoy_bootstrap.json"]
          }
          resources {
            cpu    = 100
            memory = 64
          }
          kill_timeout = "2s"
        }
      }
    }
    task "web" {
      driver = "raw_exec"
      config {
        command = "/bin/sleep"
        args    = ["300"]
      }
      lifecycle {
        hook    = "poststart"
        sidecar = false
      }
    }
  }
}
