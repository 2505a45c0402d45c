<#
.SYNOPSIS
    Launch a pvbess-trainer night on Windows: doctor, GPU monitor, trainer, summary.

.DESCRIPTION
    Creates .venv when it is missing (idempotent), then runs `trainer launch`, which checks
    the machine (trainer doctor), starts the GPU monitor beside the trainer, writes the
    console to <run>\logs\launcher.log, forwards Ctrl+C so the trainer saves a checkpoint,
    and prints the GPU summary and the results table. With -Schedule it registers a
    Windows scheduled task instead of running now.

.PARAMETER Agent
    all (the whole night), sac, ppo, a2c or baseline.
.PARAMETER Config
    Config files merged over trainer\configs\default.yaml, in order.
.PARAMETER DeviceProfile
    Device profile: auto, cpu, rtx4060-laptop-8gb, t4-16gb, rtx5090-32gb or h100-80gb
    (-Profile also works; the parameter is not named $Profile, PowerShell's own variable).
.PARAMETER Budget
    Time for the night, e.g. 10h or 90m.
.PARAMETER FinishBy
    Local time the night must end by, HH:MM (a time already past means tomorrow).
.PARAMETER Resume
    Resume a run folder; 'latest' resumes the newest.
.PARAMETER Monitor
    Always run the GPU monitor, and print live GPU status every few seconds.
.PARAMETER NoMonitor
    Never run the GPU monitor.
.PARAMETER Quick
    A small budget per agent: a smoke run of the whole night.
.PARAMETER Schedule
    Register a scheduled task that starts the night every day at this time (HH:MM), with the
    same options; -WhatIf shows the task without registering it.
.PARAMETER Extra
    Further trainer options, e.g. --set sac.batch_size=128.

.EXAMPLE
    .\launchers\launch_training_gpu_optimized.ps1 -Monitor
.EXAMPLE
    .\launchers\launch_training_gpu_optimized.ps1 -Agent a2c -Budget 2h
.EXAMPLE
    .\launchers\launch_training_gpu_optimized.ps1 -Schedule 22:00 -FinishBy 07:00
#>
[CmdletBinding(SupportsShouldProcess, DefaultParameterSetName = 'Untimed')]
param(
    [ValidateSet('all', 'sac', 'ppo', 'a2c', 'baseline')]
    [string]$Agent = 'all',
    [string[]]$Config = @(),
    [Alias('Profile')]
    [ValidateSet('', 'auto', 'cpu', 'rtx4060-laptop-8gb', 't4-16gb', 'rtx5090-32gb', 'h100-80gb')]
    [string]$DeviceProfile = '',
    [Parameter(ParameterSetName = 'Budget', Mandatory = $true)]
    [ValidatePattern('^\s*(\d+(\.\d+)?h)?\s*(\d+(\.\d+)?m)?\s*(\d+(\.\d+)?s)?\s*$')]
    [string]$Budget,
    [Parameter(ParameterSetName = 'FinishBy', Mandatory = $true)]
    [ValidatePattern('^([01]?\d|2[0-3]):[0-5]\d$')]
    [string]$FinishBy,
    [string]$Resume = '',
    [switch]$Monitor,
    [switch]$NoMonitor,
    [switch]$Quick,
    [ValidatePattern('^(|([01]?\d|2[0-3]):[0-5]\d)$')]
    [string]$Schedule = '',
    [Parameter(ValueFromRemainingArguments = $true)]
    [string[]]$Extra = @()
)

Set-StrictMode -Version Latest
$ErrorActionPreference = 'Stop'

$Root = Split-Path -Parent $PSScriptRoot
$Venv = Join-Path $Root '.venv'
$Python = Join-Path $Venv 'Scripts\python.exe'
$Trainer = Join-Path $Venv 'Scripts\trainer.exe'
$TorchSpec = if ($env:PVBESS_TORCH) { $env:PVBESS_TORCH } else { 'torch==2.13.0 torchvision==0.28.0' }
# PyPI's torch for Windows is CPU-only: with an NVIDIA GPU present, install the CUDA 12.8 build
# (it runs every card from Turing to RTX 50xx), unless PVBESS_TORCH says otherwise.
$TorchIndex = ''
if (-not $env:PVBESS_TORCH -and (Get-CimInstance Win32_VideoController -ErrorAction SilentlyContinue |
        Where-Object { $_.Name -match 'NVIDIA' })) {
    $TorchIndex = 'https://download.pytorch.org/whl/cu128'
}

function Invoke-Native {
    param([string]$Exe, [string[]]$Arguments, [string]$What)
    & $Exe @Arguments
    if ($LASTEXITCODE -ne 0) {
        throw "$What failed with exit code $LASTEXITCODE"
    }
}

function Initialize-Venv {
    $stampFile = Join-Path $Venv '.pvbess-install'
    $hashInput = (Get-Content (Join-Path $Root 'pyproject.toml') -Raw) + $TorchSpec
    $stream = [IO.MemoryStream]::new([Text.Encoding]::UTF8.GetBytes($hashInput))
    $stamp = (Get-FileHash -InputStream $stream -Algorithm SHA256).Hash
    if ((Test-Path $Python) -and (Test-Path $stampFile) -and ((Get-Content $stampFile -Raw).Trim() -eq $stamp)) {
        return
    }
    if (-not (Test-Path $Python)) {
        Write-Host '[pvbess] creating .venv with Python 3.11'
        Invoke-Native -Exe 'py' -Arguments @('-3.11', '-m', 'venv', $Venv) -What 'creating .venv (is Python 3.11 installed? winget install Python.Python.3.11)'
    }
    $clock = [Diagnostics.Stopwatch]::StartNew()
    Write-Host '[pvbess] installing dependencies (the first run takes a few minutes; pip''s progress follows)'
    $torchArgs = @('-m', 'pip', 'install') + $TorchSpec.Split(' ')
    if ($TorchIndex) {
        Write-Host "[pvbess] step 1/2: $TorchSpec, the CUDA build from $TorchIndex (an NVIDIA GPU is present)"
        $torchArgs += @('--index-url', $TorchIndex)
    }
    else {
        Write-Host "[pvbess] step 1/2: $TorchSpec"
    }
    Invoke-Native -Exe $Python -Arguments $torchArgs -What 'installing torch (set PVBESS_TORCH to choose another build)'
    Write-Host "[pvbess] step 1/2 done after $([int]$clock.Elapsed.TotalSeconds) s; step 2/2: pvbess-trainer"
    # The export extra: `trainer export` (ONNX and onnxruntime), as launch.sh installs it.
    Invoke-Native -Exe $Python -Arguments @('-m', 'pip', 'install', '-e', ($Root + '[export,tune]')) -What 'installing pvbess-trainer'
    Set-Content -Path $stampFile -Value $stamp
    Write-Host "[pvbess] environment ready after $([int]$clock.Elapsed.TotalSeconds) s"
}

function Get-LaunchArguments {
    $launchArgs = @('launch', '--agent', $Agent)
    foreach ($file in $Config) { $launchArgs += @('--config', $file) }
    if ($DeviceProfile) { $launchArgs += @('--profile', $DeviceProfile) }
    if ($Budget) { $launchArgs += @('--budget', $Budget) }
    if ($FinishBy) { $launchArgs += @('--finish-by', $FinishBy) }
    if ($Resume) { $launchArgs += @('--resume', $Resume) }
    if ($Monitor) { $launchArgs += @('--monitor', '--live-status', '5') }
    if ($NoMonitor) { $launchArgs += '--no-monitor' }
    if ($Quick) { $launchArgs += '--quick' }
    if ($Extra.Count -gt 0) { $launchArgs += @('--') + $Extra }
    return $launchArgs
}

function ConvertTo-TaskArgument {
    # One argument of the task's command line, quoted (paths such as C:\Users\Jane Doe\...).
    param([string]$Value)
    return '"' + ($Value -replace '"', '\"') + '"'
}

function Get-TaskArguments {
    # The night the task starts: every option of this call, so the scheduled night is this one.
    $taskArgs = @('-NoProfile', '-ExecutionPolicy', 'Bypass', '-File', (ConvertTo-TaskArgument $PSCommandPath),
        '-Agent', $Agent)
    if ($FinishBy) { $taskArgs += @('-FinishBy', $FinishBy) }
    if ($Budget) { $taskArgs += @('-Budget', $Budget) }
    if ($DeviceProfile) { $taskArgs += @('-DeviceProfile', $DeviceProfile) }
    foreach ($file in $Config) { $taskArgs += @('-Config', (ConvertTo-TaskArgument (Resolve-Path $file).Path)) }
    if ($Monitor) { $taskArgs += '-Monitor' }
    if ($NoMonitor) { $taskArgs += '-NoMonitor' }
    if ($Quick) { $taskArgs += '-Quick' }
    foreach ($item in $Extra) { $taskArgs += (ConvertTo-TaskArgument $item) }
    return ($taskArgs -join ' ')
}

function Register-Night {
    if (-not $FinishBy -and -not $Budget) {
        throw '-Schedule needs -FinishBy or -Budget, so the night ends in time for the morning'
    }
    $action = New-ScheduledTaskAction -Execute 'powershell.exe' -Argument (Get-TaskArguments) -WorkingDirectory $Root
    $trigger = New-ScheduledTaskTrigger -Daily -At $Schedule
    # A laptop night must start and keep going on battery; Windows' defaults would skip it.
    $settings = New-ScheduledTaskSettingsSet -MultipleInstances IgnoreNew -WakeToRun -StartWhenAvailable `
        -AllowStartIfOnBatteries -DontStopIfGoingOnBatteries
    if ($PSCmdlet.ShouldProcess("task 'pvbess-trainer': powershell.exe $(Get-TaskArguments)", "Register daily at $Schedule")) {
        Register-ScheduledTask -TaskName 'pvbess-trainer' -Action $action -Trigger $trigger -Settings $settings -Force | Out-Null
        Write-Host "[pvbess] scheduled: every day at $Schedule (task 'pvbess-trainer')"
        Write-Host "[pvbess] remove it with: Unregister-ScheduledTask -TaskName pvbess-trainer -Confirm:`$false"
    }
}

function Stop-LeftoverMonitor {
    # trainer launch stops its monitor itself; this catches one left by a launcher that was killed.
    $pidFiles = Get-ChildItem -Path (Join-Path $Root 'outputs') -Filter 'monitor.pid' -Recurse -ErrorAction SilentlyContinue
    foreach ($file in $pidFiles) {
        $monitorPid = [int](Get-Content $file.FullName -Raw)
        Stop-Process -Id $monitorPid -ErrorAction SilentlyContinue
        Remove-Item $file.FullName -ErrorAction SilentlyContinue
    }
}

if ($Monitor -and $NoMonitor) {
    throw 'pass either -Monitor or -NoMonitor, not both'
}
if ($Schedule) {
    Register-Night  # the task sets up .venv when it first runs
    exit 0
}
Initialize-Venv
$exitCode = 0
try {
    & $Trainer @(Get-LaunchArguments)
    $exitCode = $LASTEXITCODE
}
finally {
    Stop-LeftoverMonitor
}
exit $exitCode
