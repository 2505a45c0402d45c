<#
.SYNOPSIS
    Train A2C only: launch_training_gpu_optimized.ps1 -Agent a2c, with the same options.

.EXAMPLE
    .\launchers\launch_a2c_training_gpu.ps1 -Monitor -Budget 2h
#>
[CmdletBinding(SupportsShouldProcess, DefaultParameterSetName = 'Untimed')]
param(
    [string[]]$Config = @(),
    [Alias('Profile')]
    [string]$DeviceProfile = '',
    [Parameter(ParameterSetName = 'Budget', Mandatory = $true)]
    [string]$Budget,
    [Parameter(ParameterSetName = 'FinishBy', Mandatory = $true)]
    [string]$FinishBy,
    [string]$Resume = '',
    [switch]$Monitor,
    [switch]$NoMonitor,
    [switch]$Quick,
    [string]$Schedule = '',
    [Parameter(ValueFromRemainingArguments = $true)]
    [string[]]$Extra = @()
)

Set-StrictMode -Version Latest
$ErrorActionPreference = 'Stop'

& (Join-Path $PSScriptRoot 'launch_training_gpu_optimized.ps1') -Agent 'a2c' @PSBoundParameters
if ($LASTEXITCODE -ne 0) {
    exit $LASTEXITCODE
}
