import { render, screen, within } from '@testing-library/react'
import { describe, expect, it } from 'vitest'
import type { DatasetReport as Report } from '../types'
import { DatasetReport } from './DatasetReport'

const report = {
  format: 'alpaca', task: 'sft', numbered_by: 'line', rows: 50, usable_rows: 47, bad_row_count: 3,
  bad_rows: [
    { line: 5, reason: 'blank line' },
    { line: 10, reason: "'instruction' is a number, not text; missing 'output'" },
    { line: 20, reason: 'malformed JSON: Unterminated string starting at column 17' },
  ],
  warning_count: 1,
  warnings: [{ line: 15, message: "key 'Input' looks like 'input' and was ignored: field names must match exactly" }],
  notes: ['data.jsonl holds one JSON list of rows, not a row per line: it was read as JSON.'],
  columns: ['Input', 'instruction', 'output'],
} as Report

describe('DatasetReport', () => {
  it('lists every row it cannot use and every warning of a row it uses, by line', () => {
    render(<DatasetReport report={report} />)
    expect(screen.getByTestId('report-rows')).toHaveTextContent('50')
    expect(screen.getByTestId('report-warnings')).toHaveTextContent('1')
    const bad = within(screen.getByRole('table', { name: 'Rows that cannot be used' }))
    expect(bad.getByRole('row', { name: '5 blank line' })).toBeInTheDocument()
    expect(bad.getByRole('row', { name: /^10 'instruction' is a number, not text; missing 'output'$/ })).toBeInTheDocument()
    const warned = within(screen.getByRole('table', { name: 'Warnings of rows that are used' }))
    expect(warned.getByRole('row', { name: /^15 key 'Input' looks like 'input'/ })).toBeInTheDocument()
    expect(screen.getByText(/it was read as JSON/)).toBeInTheDocument()
  })

  it('counts parquet rows as rows, not lines', () => {
    render(<DatasetReport report={{ ...report, numbered_by: 'row', warnings: [], warning_count: 0, notes: [] }} />)
    expect(within(screen.getByRole('table', { name: 'Rows that cannot be used' })).getByRole('columnheader', { name: 'Row' })).toBeInTheDocument()
    expect(screen.queryByTestId('report-warnings')).toBeNull()
  })
})
