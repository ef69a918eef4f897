job "web" {
  group "g" {
    network {
      mode = "host"
      port "http" { static = 8080 }
      port "admin" {}
      port "db" { to = 5432 }
    }
    task "t" {
      driver = "raw_exec"
      resources {
        network {
          mbits = 10
          port "metrics" {}
        }
      }
      service {
        name = "web"
        port = "http"
      }
    }
  }
}
