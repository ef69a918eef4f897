# Every field Drover honours, each with a value other than its default, so a dropped one shows.
job "every-field" {
  name        = "every-field-name"
  namespace   = "default"
  region      = "global"
  type        = "service"
  priority    = 71
  datacenters = ["dc1", "dc2"]
  all_at_once = true

  meta {
    owner = "ops"
  }

  constraint {
    attribute = "${attr.kernel.name}"
    operator  = "="
    value     = "linux"
  }

  affinity {
    attribute = "${node.datacenter}"
    value     = "dc1"
    weight    = 40
  }

  spread {
    attribute = "${node.datacenter}"
    weight    = 30
    target "dc1" {
      percent = 60
    }
    target "dc2" {
      percent = 40
    }
  }

  update {
    max_parallel      = 2
    health_check      = "task_states"
    min_healthy_time  = "11s"
    healthy_deadline  = "4m"
    progress_deadline = "9m"
    auto_revert       = true
    auto_promote      = false
    canary            = 1
    stagger           = "31s"
  }

  reschedule {
    attempts       = 4
    interval       = "2h"
    delay          = "45s"
    delay_function = "fibonacci"
    max_delay      = "30m"
    unlimited      = false
  }

  migrate {
    max_parallel = 3
  }

  group "web" {
    count                        = 2
    shutdown_delay               = "7s"
    stop_after_client_disconnect = "90s"

    meta {
      tier = "front"
    }

    constraint {
      distinct_hosts = true
    }

    affinity {
      attribute = "${meta.rack}"
      value     = "r1"
      weight    = -20
    }

    spread {
      attribute = "${meta.rack}"
    }

    restart {
      attempts = 3
      interval = "10m"
      delay    = "20s"
      mode     = "delay"
    }

    reschedule {
      attempts  = 0
      unlimited = true
      delay     = "10s"
    }

    migrate {
      max_parallel = 2
    }

    ephemeral_disk {
      size = 350
    }

    network {
      mode = "host"
      port "http" {
        to = 8080
      }
      port "admin" {
        static = 9901
      }
    }

    volume "data" {
      type      = "host"
      source    = "shared"
      read_only = true
    }

    service {
      name = "every-web"
      port = "http"
      tags = ["web", "v1"]
      meta {
        team = "ops"
      }
      check {
        name     = "alive"
        type     = "http"
        path     = "/health"
        method   = "GET"
        protocol = "http"
        interval = "12s"
        timeout  = "3s"

        initial_status  = "warning"
        tls_skip_verify = true
        header {
          X-Probe = ["a", "b"]
        }
      }
    }

    task "server" {
      driver         = "raw_exec"
      kill_timeout   = "17s"
      kill_signal    = "SIGINT"
      leader         = true
      shutdown_delay = "2s"

      config {
        command = "/bin/sleep"
        args    = ["600"]
      }

      env {
        GREETING = "hello"
      }

      meta {
        role = "server"
      }

      constraint {
        attribute = "${attr.os.name}"
        operator  = "!="
        value     = "windows"
      }

      resources {
        cpu        = 150
        memory     = 96
        memory_max = 192
      }

      restart {
        attempts = 5
      }

      logs {
        max_files     = 4
        max_file_size = 7
      }

      volume_mount {
        volume      = "data"
        destination = "/srv/data"
        read_only   = true
      }

      template {
        data          = "port={{ env \"NOMAD_PORT_http\" }}"
        destination   = "local/app.conf"
        perms         = "600"
        change_mode   = "signal"
        change_signal = "SIGHUP"
        splay         = "3s"
      }

      service {
        name = "every-admin"
        port = "admin"
        tags = ["admin"]
      }
    }

    task "init" {
      driver = "raw_exec"

      lifecycle {
        hook    = "prestart"
        sidecar = false
      }

      config {
        command = "/bin/true"
      }
    }
  }
}
